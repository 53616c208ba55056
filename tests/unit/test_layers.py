"""The folders show the architecture: control-machine code (control/) imports no role, fact or
operation, nor our pyinfra extensions; the extensions (pyinfra_ext/) import no role, fact or
operation, and only they replace anything of pyinfra's; facts (roles/facts/) import no operation
or role; operations (roles/operations/) import no role; and no import circle joins our modules.

The roles sit in three rooms, each known from its folder: single-host roles (roles/*.py, each
an apply(profile, ...) that deploy.py composes) import no engine and nothing of the fleet; the
engines (roles/engines/, one package per engine behind the dispatch's contract) import nothing of
the fleet nor of each other, and nothing outside their room imports an engine's package; the
fleet (roles/fleet/) is imported by nothing of ours. Only the engine dispatch and the profile's
per-platform tables compare `platform`. Read from the source with ast."""

import ast
import functools
import importlib.util
from pathlib import Path

from tests.unit.test_layout_paths import docstrings

REPO = Path(__file__).resolve().parents[2]


def parsed(path: Path) -> ast.Module:
    """path's syntax tree, parsed once per content (several checks walk every module)."""
    st = path.stat()
    return _parsed(str(path), st.st_mtime_ns, st.st_size)


@functools.cache
def _parsed(path: str, mtime_ns: int, size: int) -> ast.Module:
    return ast.parse(Path(path).read_text())


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted([*REPO.glob("control/*.py"), *REPO.glob("pyinfra_ext/*.py"), *REPO.glob("roles/**/*.py")]):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def imports(path: Path, ours: dict) -> set[str]:
    """Our modules `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(parsed(path)):
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


def with_packages(name: str, deps: set[str], ours: dict) -> set[str]:
    """`deps` and the packages Python runs first to import each of them: importing roles.engines.common
    runs roles/engines/__init__.py too (and a module's own packages run before it)."""
    out = set(deps)
    for dep in [*deps, name]:
        parts = dep.split(".")
        out |= {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in ours}
    return out - {name}


def test_no_import_circle():
    ours = modules()
    assert circle({name: with_packages(name, imports(path, ours), ours) for name, path in ours.items()}) is None


def test_the_checks_see_a_breach_and_a_circle(tmp_path):
    fact = tmp_path / "x.py"
    fact.write_text("from roles import driver\nfrom roles.facts import system\n")
    ours = {"roles.driver": fact, "roles.facts": fact, "roles.facts.system": fact}
    assert imports(fact, ours) == {"roles.driver", "roles.facts.system"}
    assert layer("roles.driver") in FORBIDDEN[layer("roles.facts.x")]
    assert layer("pyinfra_ext.memo") in FORBIDDEN[layer("control.profile")]
    assert circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert circle({"a": {"b"}, "b": set()}) is None
    # a package that imports its own module, which imports a sibling through the package
    ours = {"p": fact, "p.engine": fact, "p.common": fact}
    graph = {"p": {"p.engine"}, "p.engine": {"p.common"}, "p.common": set()}
    assert circle({n: with_packages(n, d, ours) for n, d in graph.items()}) == ["p", "p.engine", "p"]


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
    roles = sorted(p for p in REPO.glob("roles/**/*.py") if p.parent.name not in ("facts", "operations"))
    assert roles, "no role modules found"
    assert {p.name: defines_operations_or_facts(p) for p in roles if defines_operations_or_facts(p)} == {}
    # The check sees both kinds where they belong.
    assert "_directory" in defines_operations_or_facts(REPO / "roles/operations/paths.py")
    assert "Account" in defines_operations_or_facts(REPO / "roles/facts/accounts.py")


def undocumented_arguments(path: Path) -> list[str]:
    """Arguments of an @operation its docstring gives no `+ name:` line, as pyinfra's own operations do."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and "operation" in {
            getattr(d.func if isinstance(d, ast.Call) else d, "id", None) for d in node.decorator_list
        }:
            doc = ast.get_docstring(node) or ""
            found += [f"{node.name}({a.arg})" for a in node.args.args if f"+ {a.arg}:" not in doc]
    return found


# Where an operation's arguments are not documented yet, and why.
UNDOCUMENTED: dict[str, str] = {}


def test_operations_document_their_arguments(tmp_path):
    sources = [*REPO.glob("roles/**/*.py"), *REPO.glob("pyinfra_ext/*.py")]
    found = {
        str(p.relative_to(REPO)): undocumented_arguments(p)
        for p in sources
        if str(p.relative_to(REPO)) not in UNDOCUMENTED and undocumented_arguments(p)
    }
    assert found == {}
    probe = tmp_path / "x.py"
    probe.write_text('@operation()\ndef op(a, b):\n    """\n    Op.\n\n    + a: the a\n    """\n')
    assert undocumented_arguments(probe) == ["op(b)"]


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


def room(name: str) -> str:
    """The room of one of our modules under roles/: facts, operations, engines (the dispatch and
    shared parts), engines.<engine> (one engine's package), fleet, or role (a single-host role)."""
    parts = name.split(".")
    if parts[0] != "roles" or len(parts) == 1:
        return parts[0]
    if parts[1] in ("facts", "operations", "fleet"):
        return parts[1]
    if parts[1] == "engines":
        return f"engines.{parts[2]}" if len(parts) > 3 else "engines"
    return "role"


def room_breaches(ours: dict[str, Path]) -> list[str]:
    found = []
    for name, path in ours.items():
        mine = room(name)
        for dep in sorted(imports(path, ours)):
            theirs = room(dep)
            if theirs == mine:
                continue
            if mine == "role" and (theirs.startswith("engines") or theirs == "fleet"):
                found.append(f"{name} (a single-host role) imports {dep}")
            elif mine.startswith("engines") and theirs == "fleet":
                found.append(f"{name} (an engine) imports {dep} (the fleet)")
            elif theirs.startswith("engines.") and not mine.startswith("engines"):
                found.append(
                    f"{name} imports {dep}: outside roles/engines/, only the dispatch (roles.engines.dispatch)"
                )
            elif mine.startswith("engines.") and theirs.startswith("engines.") and mine != theirs:
                found.append(f"{name} imports {dep}: one engine's package imports another's")
            elif theirs == "fleet":
                found.append(f"{name} imports {dep}: nothing of ours imports the fleet (deploy_fleet.py does)")
    return found


def test_each_room_keeps_its_rule():
    ours = modules()
    assert {room(n) for n in ours if n.startswith("roles.")} >= {
        "role",
        "engines",
        "engines.kt",
        "engines.vllm",
        "fleet",
    }
    assert room_breaches(ours) == []


def test_the_room_check_sees_a_breach(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("from roles.fleet import artifacts\nfrom roles.engines.kt import launch\n")
    empty = tmp_path / "empty.py"
    empty.write_text("")
    ours = {"roles.model": src, "roles.fleet.artifacts": empty, "roles.engines.kt.launch": empty}
    assert room_breaches(ours) == [
        "roles.model (a single-host role) imports roles.engines.kt.launch",
        "roles.model (a single-host role) imports roles.fleet.artifacts",
    ]
    ours = {"roles.engines.vllm.engine": src, "roles.fleet.artifacts": empty, "roles.engines.kt.launch": empty}
    assert len(room_breaches(ours)) == 2


def test_single_host_roles_apply_a_profile():
    """Each single-host role has apply(profile, ...): deploy.py composes them, one call each."""
    lacking = []
    for path in sorted(REPO.glob("roles/*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text())
        applies = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply"]
        if not applies or applies[0].args.args[0].arg != "profile":
            lacking.append(path.name)
    assert lacking == []


def test_engines_keep_one_contract():
    """Each engine's engine.py has the dispatch's contract (roles/engines/dispatch.py), the same
    parameters, so deploy.py and the fleet ask the engine and never the platform."""
    from roles.engines import dispatch

    shapes = {}
    for platform, engine in dispatch.BY_PLATFORM.items():
        tree = ast.parse(Path(engine.__file__).read_text())
        defs = {n.name: [a.arg for a in n.args.args] for n in tree.body if isinstance(n, ast.FunctionDef)}
        shapes[platform] = {k: defs.get(k) for k in ("apply", "artifacts")}
    assert shapes["l40s"] == shapes["gb10"]
    assert all(shapes["l40s"].values())
    assert {Path(e.__file__).parent.name for e in dispatch.BY_PLATFORM.values()} == {"kt", "vllm"}


# Where `platform` may be compared: the engine dispatch and the profile's per-platform tables.
PLATFORM_ALLOWED = {"roles/engines/dispatch.py", "control/profile.py"}


def platform_comparisons(path: Path) -> list[int]:
    """Lines that compare, or look up by, `platform`: x.platform == ..., v["platform"] in ...,
    TABLE[x.platform]."""

    def is_platform(node) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "platform") or (
            isinstance(node, ast.Subscript) and getattr(node.slice, "value", None) == "platform"
        )

    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare) and any(is_platform(n) for n in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_platform(node.slice):
            lines.append(node.lineno)
    return lines


def test_no_platform_comparison_outside_the_dispatch_and_the_profile():
    sources = [
        *REPO.glob("*.py"),
        *REPO.glob("control/*.py"),
        *REPO.glob("pyinfra_ext/*.py"),
        *REPO.glob("roles/**/*.py"),
    ]
    found = {
        str(p.relative_to(REPO)): platform_comparisons(p)
        for p in sources
        if str(p.relative_to(REPO)) not in PLATFORM_ALLOWED and platform_comparisons(p)
    }
    assert found == {}
    # the check sees them where they are allowed
    assert platform_comparisons(REPO / "roles/engines/dispatch.py")
    assert platform_comparisons(REPO / "control/profile.py")
    probe = REPO / "tests" / "unit" / "data" / "_probe_platform.py"
    try:
        probe.write_text('a = p.platform == "gb10"\nb = v["platform"] != "l40s"\nc = T[p.platform]\nd = p.platform_x\n')
        assert platform_comparisons(probe) == [1, 2, 3]
    finally:
        probe.unlink()


# --- files/: the host tools ----------------------------------------------------------------------
# Each host tool belongs to a room, as the roles do: the room whose modules run or install it (the
# fleet's peer server, the vLLM engine's build), or "shared" when several rooms use it. Only its own
# room names a room's tool. glm_flash_host.py is what the tools share (sha256, durable writes, host
# paths); the deploy installs it beside every tool (roles/operations/uploads.py host_tool).
TOOL_ROOMS = {
    "glm-flash": "shared",  # status, closure: the summary, the fleet, the operator
    "glm-flash-check-flags": "shared",  # both engines' launch flags through their own parser
    "glm-flash-engine": "shared",  # engine environments: build, switch, rollback (both engines)
    "glm-flash-fix-cuda-header": "shared",  # the CUDA header role and its dpkg hook
    "glm-flash-fork-patch": "engines.vllm",
    "glm-flash-gateway-launch": "fleet",
    "glm-flash-gpu-check": "shared",
    "glm-flash-gpu-metrics": "shared",
    "glm-flash-job": "shared",
    "glm-flash-launch": "shared",
    "glm-flash-model-fetch": "shared",  # the model role's download, the fleet's transfer
    "glm-flash-notify": "shared",
    "glm-flash-nvidia-repo": "shared",
    "glm-flash-patch": "shared",  # the KT engine's patch sets and the CUDA header
    "glm-flash-peer": "fleet",
    "glm-flash-preflight": "shared",  # sh
    "glm-flash-ready": "shared",
    "glm-flash-vllm-build": "engines.vllm",
    "glm_flash_defaults.py": "engines.vllm",  # the thinking-budget middleware, in vLLM's site-packages
    "glm_flash_host.py": "shared",
    "hf-hub-requirements.txt": "shared",  # the downloader's lock (data)
}
# Beyond the standard library and glm_flash_host, what a tool may import, and why.
TOOL_IMPORTS = {
    "glm-flash-check-flags": {"sglang", "vllm"},  # the engine's own parser, run by the engine's python
    "glm-flash-gateway-launch": {"sglang_router"},  # the router, run by the gateway's venv
    "glm-flash-gpu-check": {"torch"},  # its probe, run by the engine's python
    "glm-flash-model-fetch": {"httpx", "huggingface_hub"},  # `download`, run by the hub venv
}
# Installed where glm_flash_host.py is not (vLLM's site-packages), and the module itself: stdlib only.
STDLIB_ONLY = {"glm_flash_defaults.py", "glm_flash_host.py"}


def host_tools() -> dict[str, Path]:
    return {p.name: p for p in sorted((REPO / "files").iterdir()) if p.is_file()}


def is_python(path: Path) -> bool:
    first = path.read_text(errors="replace").split("\n", 1)[0]
    return path.suffix == ".py" or (first.startswith("#!") and "python" in first)


def tool_imports(path: Path) -> set[str]:
    """The top-level names of every module `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def tool_import_breaches(tools: dict[str, Path]) -> list[str]:
    import sys

    found = []
    for name, path in tools.items():
        if not is_python(path):
            continue
        allowed = set(sys.stdlib_module_names) | TOOL_IMPORTS.get(name, set())
        if name not in STDLIB_ONLY:
            allowed.add("glm_flash_host")
        found += [f"files/{name} imports {dep}" for dep in sorted(tool_imports(path) - allowed)]
    return found


def strings(path: Path) -> list[str]:
    """The string constants of a module that are not docstrings (a docstring may mention any tool)."""
    tree = parsed(path)
    docs = docstrings(tree)
    return [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    ]


def tool_room_breaches(ours: dict[str, Path], tools: dict[str, Path]) -> list[str]:
    """A room's tool named (run, installed) by a module of another room."""
    import re

    found, texts = [], {name: "\0".join(strings(path)) for name, path in ours.items()}
    for tool in tools:
        mine = TOOL_ROOMS.get(tool)
        if mine is None:
            found.append(f"files/{tool} has no room in TOOL_ROOMS")
            continue
        if mine == "shared":
            continue
        named = re.compile(rf"(?<![\w.-]){re.escape(tool)}(?![\w-])")
        for name in ours:
            if room(name) != mine and named.search(texts[name]):
                found.append(f"{name} ({room(name)}) names files/{tool}, a tool of {mine}")
    return found


def test_each_host_tool_keeps_its_room_and_imports():
    tools = host_tools()
    assert set(TOOL_ROOMS) == set(tools), "a tool of files/ without a room, or a room for a tool that is gone"
    assert set(TOOL_IMPORTS) | STDLIB_ONLY <= set(tools)
    assert tool_room_breaches(modules(), tools) == []
    assert tool_import_breaches(tools) == []
    # the tools share the module rather than copies of it
    assert {n for n, p in tools.items() if is_python(p) and "glm_flash_host" in tool_imports(p)} >= {
        "glm-flash-engine",
        "glm-flash-model-fetch",
        "glm-flash-nvidia-repo",
        "glm-flash-peer",
        "glm-flash-fork-patch",
        "glm-flash-gpu-metrics",
        "glm-flash-notify",
        "glm-flash-vllm-build",
    }


def test_the_host_tool_checks_see_a_breach(tmp_path):
    tool = tmp_path / "glm-flash-peer"
    tool.write_text("#!/usr/bin/env python3\nimport json\nfrom control import layout\nimport requests\n")
    middleware = tmp_path / "glm_flash_defaults.py"
    middleware.write_text("import glm_flash_host\n")
    assert tool_import_breaches({"glm-flash-peer": tool, "glm_flash_defaults.py": middleware}) == [
        "files/glm-flash-peer imports control",
        "files/glm-flash-peer imports requests",
        "files/glm_flash_defaults.py imports glm_flash_host",
    ]
    role = tmp_path / "x.py"
    role.write_text(
        '"""Runs glm-flash-peer (a docstring may say so)."""\nTOOL = "glm-flash-peer"\nOTHER = "glm-flash"\n'
    )
    tools = {"glm-flash-peer": tool, "glm-flash": tool, "glm-flash-new": tool}
    assert tool_room_breaches({"roles.model": role, "roles.fleet.artifacts": role}, tools) == [
        "roles.model (role) names files/glm-flash-peer, a tool of fleet",
        "files/glm-flash-new has no room in TOOL_ROOMS",
    ]
