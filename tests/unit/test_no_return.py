"""A refusal does not return: `refuse` and `fail` are typed NoReturn and always raise, so a type
checker knows a caller's names are bound after them (roles/engines/kt/engine.py's `env` after
`except LockError: refuse(...)`), and no statement of ours follows one of them in its block
(such a statement never runs). Read from the source with ast, as mypy would see it."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from control import profile
from control.problems import Problem
from roles.engines import interpreter

REPO = Path(__file__).resolve().parents[2]
SOURCES = [*REPO.glob("*.py"), *REPO.glob("control/*.py"), *REPO.glob("pyinfra_ext/*.py"), *REPO.glob("roles/**/*.py")]


def no_return_functions() -> set[str]:
    """Names of our functions annotated `-> NoReturn`."""
    found = set()
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.returns is not None:
                if ast.unparse(node.returns) in ("NoReturn", "typing.NoReturn"):
                    found.add(node.name)
    return found


def dead_after_no_return(path: Path, names: set[str]) -> list[int]:
    """Lines of statements that follow, in the same block, a call of one of `names` (or of an alias
    an import gave it)."""
    tree = ast.parse(path.read_text())
    local = set(names)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            local |= {a.asname for a in node.names if a.asname and a.name in names}
    dead = []
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for stmt, after in zip(block, block[1:]):
                call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
                func = call.func if call else None
                name = getattr(func, "id", getattr(func, "attr", None))
                if name in local:
                    dead.append(after.lineno)
    return sorted(dead)


def test_refusals_are_typed_no_return():
    for func in (profile.fail, profile.refuse, interpreter.refuse_interpreter):
        assert typing.get_type_hints(func)["return"] is typing.NoReturn, func.__qualname__
    assert {"fail", "refuse"} <= no_return_functions()


def test_refuse_raises_on_every_path(monkeypatch):
    monkeypatch.setattr(profile, "HOST_ONLY", set())
    with pytest.raises(SystemExit):
        profile.refuse("k", "problem", "fix", host="h1")
    monkeypatch.setattr(profile, "HOST_ONLY", {"h1"})
    with pytest.raises(profile.HostRefused):
        profile.fail(profile.ProfileError([Problem("h1", "k", "problem", "fix")]))


def test_nothing_follows_a_refusal():
    names = no_return_functions()
    found = {str(p.relative_to(REPO)): dead_after_no_return(p, names) for p in SOURCES}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_check_sees_a_dead_statement(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from control.profile import refuse as r\n"
        "def f(x):\n"
        "    try:\n"
        "        return g(x)\n"
        "    except E:\n"
        "        r('k', 'p', 'f')\n"
        "        return None\n"
        "    profile.fail(e)\n"
        "    raise\n"
    )
    assert dead_after_no_return(probe, {"refuse", "fail"}) == [7, 9]
