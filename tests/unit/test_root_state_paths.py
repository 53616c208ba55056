"""Root's state paths: one place (control/layout.py), the same constants in the host tools.

The host tools are single stdlib files, so they carry the paths as constants; this test fails
when a tool and control/layout.py disagree, and when root's state sits where the service user
can write (its home, /var/lib/<service_user>).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from control import layout
from control.profile import build
from roles.engines.kt import patches as engine_patches
from roles.operations import driver as driver_ops

TOOLS = Path(layout.FILES)


def constants(tool: str) -> dict[str, str]:
    """The module-level string constants of a host tool; `os.environ.get(NAME, DEFAULT)` gives DEFAULT
    (the environment override is for tests), `A + "/x"` is evaluated from earlier constants."""
    tree = ast.parse((TOOLS / tool).read_text())
    out: dict[str, str] = {}

    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return out.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = value(node.left), value(node.right)
            return left + right if left is not None and right is not None else None
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" and len(node.args) == 2:
            return value(node.args[1])
        return None

    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            v = value(node.value)
            if v is not None:
                out[node.targets[0].id] = v
    return out


@pytest.mark.parametrize(
    "tool,name,expected",
    [
        ("glm-flash-patch", "ROOT_STATE", layout.ROOT_STATE),
        ("glm-flash-patch", "STATE_DIR", layout.PATCH_STATE),
        ("glm-flash-fix-cuda-header", "STATE_DIR", layout.PATCH_STATE),
        ("glm-flash-engine", "PATCH_STATE_DIR", layout.PATCH_STATE),
        ("glm-flash-engine", "CHECK_DIR", layout.ENGINE_CHECKS),
    ],
)
def test_host_tools_use_the_layout_paths(tool, name, expected):
    assert constants(tool).get(name) == expected, f"files/{tool} {name} differs from control/layout.py"


def test_roles_use_the_layout_paths():
    assert driver_ops.INITRAMFS_MARKER == layout.INITRAMFS_MARKER
    assert engine_patches.STATE_DIR == layout.PATCH_STATE


def test_root_state_is_outside_the_service_users_home():
    prof = build("h", {})
    home = layout.service_home(prof)
    for path in (layout.ROOT_STATE, layout.PATCH_STATE, layout.INITRAMFS_MARKER):
        assert not (path + "/").startswith(home + "/"), path
    assert layout.OLD_PATCH_STATE.startswith(home + "/"), "the old place, for the migration note"
