"""Host paths are built in control/layout.py only, and the repo root is found there once: read from
the other modules' source with ast (docstrings aside), a module that spells one of our host paths
(our configuration, units, state and logs), joins a path onto install_root, or finds the repo from
its own `__file__` fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYOUT = REPO / "control" / "layout.py"
# Ours on the host, outside install_root: configuration, units, root's state, logs.
# Where a join onto install_root stays, and why.
JOINS_ALLOWED = {
    "roles/fleet/artifacts.py": "a staged file's place, its set's root (install_root or the checkpoint's path) "
    "and the entry's relative path, which its manifest carries; the entries' relative paths are spelled "
    "in the engines' artifacts() (not yet from layout: that module is being reworked)",
}
OUR_HOST_PATH = re.compile(
    r"/(?:etc/glm-flash|etc/systemd/system/glm-flash|var/lib/glm-flash|var/log/glm-flash|var/cache/glm-flash|run/glm-flash)"
)
# The knobs' defaults and their reasons (control/defaults.py) name host paths by design: layout builds from them.
KNOB_TABLE = LAYOUT.parent / "defaults.py"


def sources() -> list[Path]:
    found = [
        *REPO.glob("*.py"),
        *REPO.glob("control/*.py"),
        *REPO.glob("pyinfra_ext/*.py"),
        *REPO.glob("roles/**/*.py"),
    ]
    return sorted(p for p in found if p != LAYOUT)


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def our_host_path_literals(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    skip = docstrings(tree)
    return [
        f"{node.lineno}: {node.value}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and OUR_HOST_PATH.search(node.value)
    ]


def joins_onto_install_root(path: Path) -> list[int]:
    """f-strings that start from install_root, or from a name given its value in the same function."""
    tree = ast.parse(path.read_text())
    found = []
    for func in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        roots = {"install_root"}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and "install_root" in ast.unparse(node.value):
                for target in node.targets:
                    elts = target.elts if isinstance(target, ast.Tuple) else [target]
                    values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value] * len(elts)
                    roots |= {
                        t.id
                        for t, v in zip(elts, values)
                        if isinstance(t, ast.Name) and ast.unparse(v).endswith("install_root")
                    }
        for node in ast.walk(func):
            if isinstance(node, ast.JoinedStr) and len(node.values) > 1:
                first, then = node.values[0], node.values[1]
                if (
                    isinstance(first, ast.FormattedValue)
                    and isinstance(then, ast.Constant)
                    and str(then.value).startswith("/")
                ):
                    expr = first.value
                    name = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", None)
                    if name in roots:
                        found.append(node.lineno)
    return sorted(set(found))


def finds_the_repo(path: Path) -> list[int]:
    """`Path(__file__)` or `os.path.dirname(__file__)`: the repo root found again."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and any(isinstance(a, ast.Name) and a.id == "__file__" for a in node.args)
    ]


def test_our_host_paths_are_spelled_in_layout_only():
    found = {str(p.relative_to(REPO)): our_host_path_literals(p) for p in sources() if p != KNOB_TABLE}
    assert {k: v for k, v in found.items() if v} == {}
    assert our_host_path_literals(LAYOUT)  # the check sees them where they belong


def test_no_path_is_joined_onto_install_root_outside_layout():
    found = {str(p.relative_to(REPO)): joins_onto_install_root(p) for p in sources()}
    assert {k for k, v in found.items() if v} == set(JOINS_ALLOWED)
    assert joins_onto_install_root(LAYOUT)


def test_the_repo_root_is_found_once():
    found = {str(p.relative_to(REPO)): finds_the_repo(p) for p in sources()}
    assert {k: v for k, v in found.items() if v} == {}
    assert finds_the_repo(LAYOUT)


def test_the_checks_see_a_breach(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""Writes /etc/glm-flash/x (a docstring: not a path built)."""\n'
        "from pathlib import Path\n"
        'REPO = Path(__file__).resolve().parent.parent\n'
        'UNIT = "/etc/systemd/system/glm-flash.service"\n'
        "def f(profile, p):\n"
        "    base = profile.install_root\n"
        '    a, b = f"{base}/bin/tool", f"{p.install_root}/fleet"\n'
        '    return f"{profile.port}/x", f"x{base}/y"\n'
    )
    assert finds_the_repo(probe) == [3]
    assert our_host_path_literals(probe) == ["4: /etc/systemd/system/glm-flash.service"]
    assert joins_onto_install_root(probe) == [7]
