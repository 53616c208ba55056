"""Every operation of ours documents each of its arguments (`+ name:` in its docstring), as
pyinfra's own operations do: the reader of a deploy sees what each value means where it is used."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


def operations(root: Path) -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                (isinstance(d, ast.Call) and getattr(d.func, "id", "") == "operation")
                or getattr(d, "id", "") == "operation"
                for d in node.decorator_list
            ):
                found.append((str(path.relative_to(REPO)), node))
    return found


def undocumented(node: ast.FunctionDef) -> list[str]:
    doc = ast.get_docstring(node) or ""
    # One line may document several: `+ repo_id, commit: ...`
    named = {
        name.strip()
        for line in doc.splitlines()
        if line.strip().startswith("+ ") and ":" in line
        for name in line.strip()[2:].split(":", 1)[0].split(",")
    }
    args = [a.arg for a in node.args.args + node.args.kwonlyargs]
    return [a for a in args if a not in named]


def test_every_operation_documents_its_arguments():
    found = operations(REPO / "roles")
    assert len(found) > 40, "the scan found too few operations: it no longer sees the decorator"
    missing = {f"{path}:{node.lineno} {node.name}": gaps for path, node in found if (gaps := undocumented(node))}
    assert not missing, f"operations with arguments their docstring does not name (`+ arg: ...`): {missing}"


def test_the_scan_sees_a_missing_argument(tmp_path):
    node = ast.parse('@operation()\ndef op(a, b):\n    """Doc.\n\n    + a: one\n    """\n').body[0]
    assert undocumented(node) == ["b"]
