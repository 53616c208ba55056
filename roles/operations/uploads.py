"""Operations shared by the roles."""

from __future__ import annotations

from control.layout import FILES, TEMPLATES
from roles.operations import paths


def template(src: str, dest: str, name: str = "", mode: str = "644", user: str = "root", group: str = "root", **data):
    """Render templates/<src> to dest; a hand edit on the host is put back."""
    return paths.template(str(TEMPLATES / src), dest, user=user, group=group, mode=mode, name=name, **data)


def host_tool(name: str, bin_dir: str):
    """Install one of files/ as an executable on the host."""
    return paths.put(
        str(FILES / name), f"{bin_dir}/{name}", user="root", group="root", mode="755", name=f"Install {bin_dir}/{name}"
    )
