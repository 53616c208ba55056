"""Operations shared by the roles."""

from __future__ import annotations

import weakref

from pyinfra import host

from control.layout import FILES, HOST_MODULE, TEMPLATES
from roles.operations import paths

# Per run (pyinfra's state): the (host, directory) pairs the shared host module is planned into.
_MODULE_PLANNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def template(src: str, dest: str, name: str = "", mode: str = "644", user: str = "root", group: str = "root", **data):
    """Render templates/<src> to dest; a hand edit on the host is put back."""
    return paths.template(str(TEMPLATES / src), dest, user=user, group=group, mode=mode, name=name, **data)


def host_tool(name: str, bin_dir: str):
    """Install one of files/ as an executable on the host, with the module the tools share
    (files/glm_flash_host.py) beside it first: a tool imports it from its own directory. Both are
    root's (root:root, the directory 0755), so nothing the service user writes is on their path."""
    planned = _MODULE_PLANNED.setdefault(host.state, set())
    if (host.name, bin_dir) not in planned:
        planned.add((host.name, bin_dir))
        module = f"{bin_dir}/{HOST_MODULE}"
        what = f"Install {module} (what the host tools share)"
        paths.put(str(FILES / HOST_MODULE), module, user="root", group="root", mode="644", name=what)
    return paths.put(
        str(FILES / name), f"{bin_dir}/{name}", user="root", group="root", mode="755", name=f"Install {bin_dir}/{name}"
    )
