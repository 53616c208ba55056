"""The folders show the architecture: control-machine code (control/) imports no role, fact or
operation, nor our pyinfra extensions; the extensions (pyinfra_ext/) import no role, fact or
operation, and only they replace anything of pyinfra's; facts (roles/facts/) import no operation
or role; operations (roles/operations/) import no role; and no import circle joins our modules.
Read from the source with ast."""

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted([*REPO.glob("control/*.py"), *REPO.glob("pyinfra_ext/*.py"), *REPO.glob("roles/**/*.py")]):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def imports(path: Path, ours: dict) -> set[str]:
    """Our modules `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in ours)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in ours or node.module in ours:
                    found.add(sub if sub in ours else node.module)
    return found


def layer(name: str) -> str:
    if name.startswith(("roles.facts", "roles.operations")):
        return name.split(".")[1]
    return name.split(".")[0]


# what a layer may not import
FORBIDDEN = {
    "control": {"roles", "facts", "operations", "pyinfra_ext"},
    "pyinfra_ext": {"roles", "facts", "operations"},
    "facts": {"roles", "operations"},
    "operations": {"roles"},
}


def test_each_layer_imports_only_what_is_below_it():
    ours = modules()
    breaches = [
        f"{name} imports {dep}"
        for name, path in ours.items()
        for dep in sorted(imports(path, ours))
        if layer(dep) in FORBIDDEN.get(layer(name), set())
    ]
    assert breaches == []


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of `graph` (module -> the modules it imports), or None."""
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> list[str] | None:
        if name in trail:
            return [*trail[trail.index(name) :], name]
        if name in done:
            return None
        for dep in sorted(graph.get(name, ())):
            found = visit(dep, [*trail, name])
            if found:
                return found
        done.add(name)
        return None

    return next((c for c in (visit(name, []) for name in sorted(graph)) if c), None)


def test_no_import_circle():
    ours = modules()
    assert circle({name: imports(path, ours) - {name} for name, path in ours.items()}) is None


def test_the_checks_see_a_breach_and_a_circle(tmp_path):
    fact = tmp_path / "x.py"
    fact.write_text("from roles import driver\nfrom roles.facts import system\n")
    ours = {"roles.driver": fact, "roles.facts": fact, "roles.facts.system": fact}
    assert imports(fact, ours) == {"roles.driver", "roles.facts.system"}
    assert layer("roles.driver") in FORBIDDEN[layer("roles.facts.x")]
    assert layer("pyinfra_ext.memo") in FORBIDDEN[layer("control.profile")]
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None


def defines_operations_or_facts(path: Path) -> list[str]:
    """Functions decorated @operation and classes deriving from a fact base, by name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if getattr(target, "id", getattr(target, "attr", "")) == "operation":
                    found.append(node.name)
        elif isinstance(node, ast.ClassDef):
            bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
            if bases & {"FactBase", "ParsedFact", "ShortFactBase"} or any(b.endswith("Fact") for b in bases):
                found.append(node.name)
    return found


def test_roles_keep_only_their_composition():
    """Operations live in roles/operations/, facts in roles/facts/; a role module only composes them."""
    roles = sorted(REPO.glob("roles/*.py"))
    assert roles, "no role modules found"
    assert {p.name: defines_operations_or_facts(p) for p in roles if defines_operations_or_facts(p)} == {}
    # The check sees both kinds where they belong.
    assert "_directory" in defines_operations_or_facts(REPO / "roles/operations/paths.py")
    assert "Account" in defines_operations_or_facts(REPO / "roles/facts/accounts.py")


def imports_in_functions(path: Path) -> list[int]:
    """Lines of import statements inside functions (how the old import circle grew unnoticed)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines += [n.lineno for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return lines


# Where an import inside a function is the point, and why.
LATE_IMPORTS = {
    "roles.model": "ansible, only when a vault is used: importing it under gevent prints a traceback",
    "control.pypi_cache": "requests, only when something is fetched: its import is 70-100 ms of every run",
}


def test_imports_stand_at_the_top():
    found = {name for name, path in modules().items() if imports_in_functions(path)}
    assert found == set(LATE_IMPORTS)
    sample = "def f():\n    import os\n    return os\n"
    probe = REPO / "tests" / "unit" / "data" / "_probe_imports.py"
    try:
        probe.write_text(sample)
        assert imports_in_functions(probe) == [2]
    finally:
        probe.unlink()


def pyinfra_patches(path: Path) -> list[str]:
    """Where `path` replaces something of pyinfra's: an assignment to, or setattr() on, an attribute
    of a pyinfra module it imported, or a pyinfra module looked up in sys.modules."""
    tree = ast.parse(path.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {(a.asname or a.name).split(".")[0] for a in node.names if a.name.startswith("pyinfra")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyinfra"):
            for a in node.names:
                if _is_package(node.module) and importlib.util.find_spec(f"{node.module}.{a.name}"):
                    modules.add(a.asname or a.name)
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setattr" and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for t in targets:
            while isinstance(t, ast.Attribute) and isinstance(t.value, ast.Attribute):
                t = t.value
            if isinstance(t, ast.Attribute) and getattr(t.value, "id", None) in modules:
                found.append(f"{path.name}:{node.lineno}")
        if (
            isinstance(node, ast.Subscript)
            and ast.unparse(node.value) == "sys.modules"
            and str(getattr(node.slice, "value", "")).startswith("pyinfra")
        ):
            found.append(f"{path.name}:{node.lineno}")
    return found


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def test_only_pyinfra_ext_replaces_pyinfra_internals():
    """Our replacements of pyinfra's internals live in pyinfra_ext/, which refuses to load on a
    pyinfra it was not written against (tests/unit/test_pyinfra_ext.py); nothing else patches it."""
    sources = [*REPO.glob("*.py"), *REPO.glob("control/*.py"), *REPO.glob("roles/**/*.py")]
    assert {p.name: pyinfra_patches(p) for p in sources if pyinfra_patches(p)} == {}
    ext = {p.name: pyinfra_patches(p) for p in REPO.glob("pyinfra_ext/*.py") if pyinfra_patches(p)}
    assert set(ext) == {"op_order.py", "host_failures.py"}  # the check sees them where they belong
    probe = REPO / "tests" / "unit" / "data" / "_probe_patch.py"
    try:
        probe.write_text("import pyinfra\nfrom pyinfra.api import util\nutil.x = 1\nsetattr(pyinfra, 'y', 2)\n")
        assert pyinfra_patches(probe) == ["_probe_patch.py:3", "_probe_patch.py:4"]
    finally:
        probe.unlink()
