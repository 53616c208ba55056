"""Operations shared by the roles."""

from __future__ import annotations

from pathlib import Path

from pyinfra.operations import files

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
FILES = Path(__file__).resolve().parents[2] / "files"


def template(src: str, dest: str, name: str = "", mode: str = "644", user: str = "root", group: str = "root", **data):
    """Render templates/<src> to dest; a hand edit on the host is put back."""
    return files.template(
        name=name or f"Render {dest}", src=str(TEMPLATES / src), dest=dest, mode=mode, user=user, group=group, **data
    )


def host_tool(name: str, bin_dir: str):
    """Install one of files/ as an executable on the host."""
    return files.put(
        name=f"Install {bin_dir}/{name}",
        src=str(FILES / name),
        dest=f"{bin_dir}/{name}",
        mode="755",
        user="root",
        group="root",
    )
