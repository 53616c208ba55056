"""Root's state paths: one place (control/layout.py), the same constants in the host tools.

The host tools take the host paths from files/glm_flash_host.py, the module installed beside them;
this test fails when that module and control/layout.py disagree, when a tool writes a host path
of the layout as a literal of its own instead, and when root's state sits where the service user
can write (its home, /var/lib/<service_user>).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from control import layout
from control.profile import build
from roles.engines.kt import patches as engine_patches
from roles.operations import driver as driver_ops

TOOLS = Path(layout.FILES)
spec = importlib.util.spec_from_file_location("glm_flash_host_paths", TOOLS / layout.HOST_MODULE)
host = importlib.util.module_from_spec(spec)
spec.loader.exec_module(host)

HOST_PATHS = {name: value for name, value in vars(host).items() if name.isupper() and isinstance(value, str)}
# Where a tool keeps a host path of its own, and why.
LITERALS_ALLOWED = {
    "glm-flash": "changed by other work at the time of this test (#38); its paths move to the module next",
    "glm-flash-ready": "changed by other work at the time of this test (#38); its paths move to the module next",
    "glm-flash-check-flags": "the GB10 tests load it alone into vLLM's interpreter (tests/gb10/test_fork_series.py)",
}


def test_the_host_module_has_the_layout_paths():
    assert HOST_PATHS, "no paths in files/glm_flash_host.py"
    assert {name: value for name, value in HOST_PATHS.items() if getattr(layout, name, None) != value} == {}


def path_literals(path: Path) -> list[str]:
    """Host paths of the module written out in `path` as string constants (or the start of one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [v for v in HOST_PATHS.values() if node.value == v or node.value.startswith(v + "/")]
    return found


def test_host_tools_take_the_host_paths_from_the_module():
    tools = [p for p in sorted(TOOLS.glob("glm-flash*")) if "python" in p.read_text().split("\n", 1)[0]]
    assert len(tools) > 10
    found = {p.name: path_literals(p) for p in tools if p.name not in LITERALS_ALLOWED}
    assert {name: paths for name, paths in found.items() if paths} == {}
    # the check sees one: a tool that writes the launch spec's path itself
    assert path_literals(TOOLS / "glm-flash") and not path_literals(TOOLS / "glm-flash-engine")


def test_roles_use_the_layout_paths():
    assert driver_ops.INITRAMFS_MARKER == layout.INITRAMFS_MARKER
    assert engine_patches.STATE_DIR == layout.PATCH_STATE


def test_root_state_is_outside_the_service_users_home():
    prof = build("h", {})
    home = layout.service_home(prof)
    for path in (layout.ROOT_STATE, layout.PATCH_STATE, layout.INITRAMFS_MARKER):
        assert not (path + "/").startswith(home + "/"), path
