"""Facts of the engine interpreter and environments. The environments are read by our host tool
(files/glm-flash-engine status --json), the patch and flag checks by glm-flash-patch and
glm-flash-check-flags; the others are POSIX sh. Parsers are static methods the unit tests feed
with real output."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from pyinfra.api import FactBase, QuoteString

from control import layout
from roles.facts import ParsedFact, flags
from roles.facts.system import ToolResult

MARKER = ".glm-flash-complete"


class PythonArtifact(FactBase):
    """sha256 recorded in an unpacked interpreter's completion marker, or None."""

    def command(self, path):
        return f"cat {shlex.quote(path + '/' + MARKER)} 2>/dev/null || true"

    def process(self, output):
        words = " ".join(output).split()
        return words[0] if words and re.fullmatch(r"[0-9a-f]{64}", words[0]) else None


class WheelhouseFiles(ParsedFact):
    """{filename: size} of the host's wheelhouse."""

    def command(self, path):
        q = shlex.quote(path)
        return f"[ -d {q} ] && find {q} -maxdepth 1 -type f -printf '%f %s\\n' || true"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> dict[str, int]:
        rows = (line.strip().rpartition(" ") for line in lines)
        return {name: int(size) for name, _, size in rows if name and size.isdigit()}


@dataclass(frozen=True)
class EngineState:
    current: str | None = None  # env name `current` points at
    previous: str | None = None
    complete: tuple = ()  # env names holding the completion marker
    present: tuple = ()  # every env directory
    dists: dict = field(default_factory=dict)  # {env: {canonical name: version}} of complete envs
    owners: dict = field(default_factory=dict)  # {env: {shared dir: last writer or "mixed"}}

    def version(self, env: str | None, name: str) -> str | None:
        return self.dists.get(env or "", {}).get(name)

    def owner_ok(self, env: str, shared: str = "transformers") -> bool | None:
        """True when the kt fork wrote `shared`/ last, False when not, None when not installed."""
        owner = self.owners.get(env, {}).get(shared)
        return None if owner is None else owner != "mixed"


class EngineEnvs(ParsedFact):
    """`glm-flash-engine status --json`: where current/previous point, which environments are
    complete, and for those their versions and the owners of shared directories. The host
    tool is the one reader of environments (verify and the deploy see the same thing)."""

    def command(self, tool):
        q = shlex.quote(tool)
        return f"if [ -x {q} ]; then {q} status --json; else echo '{{}}'; fi"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> EngineState:
        try:
            data = json.loads("\n".join(lines) or "{}")
        except ValueError:
            return EngineState()
        envs = data.get("envs") or {}
        details = data.get("details") or {}
        return EngineState(
            current=data.get("current"),
            previous=data.get("previous"),
            complete=tuple(n for n, s in envs.items() if s == "complete"),
            present=tuple(envs),
            dists={n: d.get("versions", {}) for n, d in details.items()},
            owners={n: d.get("owners", {}) for n, d in details.items()},
        )


class EnginePatchCheck(ToolResult):
    """`glm-flash-patch check --json SETS...`: {"exit": int|None, "files": {...}, "lines": [...]}.

    exit None: the tool or a set is not on the host yet (first run: uploaded earlier in
    the same run); 0 all applied; 1 something pending; 2 refused (drift or a bad set).
    """

    def command(self, tool: str, sets: list[str]):
        return self.ran([("-e", s) for s in [tool, *sets]], QuoteString(tool), "check --json", *map(QuoteString, sets))

    @staticmethod
    def parse(lines) -> dict:
        result = ToolResult.parse(lines)
        files, rest = {}, []
        for line in result["lines"]:
            if line.startswith("{"):
                try:
                    files = json.loads(line)
                    continue
                except ValueError:
                    pass
            rest.append(line)
        return {"exit": result["exit"], "files": files, "lines": rest}


def flag_check_command(python: str, tool: str, spec_json: str, properties, record_dir: str = layout.FLAG_CHECKS):
    """Root runs the tool under the system python; the engine's import happens in a transient unit
    of `properties` (roles/operations/sandboxing.py engine_check), whose output root reads as data."""
    props = [bit for p in properties for bit in flags(unit_property=p)]
    options = flags(args_json=spec_json, record_dir=record_dir)
    return ["/usr/bin/python3", "-I", QuoteString(tool), *flags(engine_python=python), *props, *options]


class LaunchFlagCheck(ToolResult):
    """{"exit": int|None, "lines": [...]}; exit None when the engine python or the tool is missing."""

    def command(self, python: str, tool: str, spec_json: str, properties=(), record_dir: str = layout.FLAG_CHECKS):
        return self.ran(
            [("-x", python), ("-e", tool)], *flag_check_command(python, tool, spec_json, properties, record_dir)
        )
