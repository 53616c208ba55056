"""Custom facts: each a small typed class that runs one command and parses it.

Parsers are plain static methods so unit tests feed them real command output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pyinfra.api import FactBase, QuoteString, StringCommand

from roles.facts import ParsedFact, fields


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    compute_capability: str
    memory_mib: int
    driver_version: str


@dataclass(frozen=True)
class GpuProcess:
    bus_id: str
    pid: int
    kind: str  # C (compute), G (graphics), C+G
    name: str
    used_mib: int

    @property
    def is_desktop(self) -> bool:
        return "G" in self.kind


class Gpus(ParsedFact):
    """GPUs nvidia-smi sees; an empty list where there is no driver or no GPU."""

    def command(self):
        return (
            "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi "
            "--query-gpu=index,name,compute_cap,memory.total,driver_version "
            "--format=csv,noheader,nounits 2>/dev/null || true"
        )

    empty_parsed = True

    @staticmethod
    def parse(lines) -> list[Gpu]:
        return [
            Gpu(int(index), name, capability, int(memory) if memory.isdigit() else 0, driver)
            for index, name, capability, memory, driver in fields(lines, 5, ",")
            if index.isdigit()
        ]


class GpuProcesses(ParsedFact):
    """Processes holding GPU memory, graphics ones included (`nvidia-smi -q -d PIDS`)."""

    def command(self):
        return "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -q -d PIDS 2>/dev/null || true"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> list[GpuProcess]:
        procs: list[GpuProcess] = []
        bus, current = "", {}

        def flush():
            if "pid" in current:
                procs.append(GpuProcess(bus_id=bus, **{"kind": "?", "name": "?", "used_mib": 0, **current}))
            current.clear()

        for raw in lines:
            line = raw.strip()
            if re.match(r"^GPU [0-9A-Fa-f:.]+$", line):
                flush()
                bus = line.split()[1]
                continue
            if ":" not in line:
                continue
            key, value = (s.strip() for s in line.split(":", 1))
            if key == "Process ID":
                flush()
                current["pid"] = int(value) if value.isdigit() else -1
            elif key == "Type":
                current["kind"] = value
            elif key == "Name":
                current["name"] = value
            elif key == "Used GPU Memory":
                m = re.match(r"(\d+)", value)
                current["used_mib"] = int(m.group(1)) if m else 0
        flush()
        return procs


class NumaNodes(ParsedFact):
    """Number of NUMA nodes (1 where the kernel shows none)."""

    def command(self):
        return "ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null || true"

    @staticmethod
    def parse(lines) -> int:
        return max(1, sum(1 for line in lines if re.search(r"/node\d+$", line.strip())))


class DefaultTarget(FactBase):
    """The systemd target the host boots into."""

    def command(self):
        return "systemctl get-default"

    def process(self, output):
        return output[0].strip() if output else ""


class CudaToolkits(ParsedFact):
    """Installed side-by-side CUDA toolkits: {version: install dir}."""

    def command(self):
        return "for d in /usr/local/cuda-[0-9]*; do [ -d \"$d\" ] && [ ! -L \"$d\" ] && echo \"$d\"; done; true"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> dict[str, str]:
        found = (re.match(r"^(/usr/local/cuda-(\d+\.\d+))/?$", line.strip()) for line in lines)
        return {m.group(2): m.group(1) for m in found if m}


class UnitFiles(ParsedFact):
    """Of the named unit files, those systemd knows, with their enablement state: {name: state}.

    Named, not all: listing every unit file takes systemd about 0.3 s, a few names 10 ms."""

    def command(self, units: list[str]):
        return StringCommand(
            "systemctl list-unit-files --no-legend --no-pager", *(QuoteString(u) for u in units), "2>/dev/null || true"
        )

    empty_parsed = True

    @staticmethod
    def parse(lines) -> dict[str, str]:
        return {parts[0]: parts[1] for parts in map(str.split, lines) if len(parts) >= 2}


# Run by the host's python3: what pip's wheel tags come from (packaging.tags: the interpreter, its
# version, sysconfig's platform, glibc as the running C library reports it, 32 or 64 bits).
HOST_PYTHON_SCRIPT = (
    "import json, platform, sys, sysconfig; "
    "print(json.dumps({'implementation': sys.implementation.name, "
    "'version': '%d.%d' % sys.version_info[:2], 'platform': sysconfig.get_platform(), "
    "'libc': ' '.join(platform.libc_ver()).strip(), 'bits': 64 if sys.maxsize > 2**32 else 32}))"
)


class HostPython(ParsedFact):
    """The host's own python3 as it describes itself: {"implementation", "version", "platform",
    "libc", "bits"} (e.g. cpython, 3.12, linux-aarch64, glibc 2.39, 64 on DGX OS); None while the
    host has no python3 (a bare Debian before base_packages). The wheels the control machine
    sends for it are chosen from this (control/engine_lock.py Target.of_interpreter), not from
    `uname -m`: what the interpreter reports is what its pip accepts."""

    def command(self):
        return StringCommand(
            "if command -v python3 >/dev/null 2>&1; then python3 -I -c",
            QuoteString(HOST_PYTHON_SCRIPT),
            "; else echo missing; fi",
        )

    @staticmethod
    def parse(lines) -> dict | None:
        lines = [line.strip() for line in lines if line.strip()]
        if not lines or lines == ["missing"]:
            return None
        try:
            found = json.loads(lines[-1])
        except ValueError:
            return {"implementation": "", "version": "", "platform": "", "libc": "", "said": " ".join(lines)[:200]}
        return found if isinstance(found, dict) else None


class ToolResult(ParsedFact):
    """Base of facts that run one of our host tools: {"exit": its exit code, "lines": its output}.

    Their commands print `missing` where the tool is not on the host yet (a first deploy
    uploads it later in the same run): exit is None then.
    """

    empty_parsed = True

    @staticmethod
    def ran(needs: list[tuple[str, str]], *command) -> StringCommand:
        """`command`, its stderr with its output, then `exit=CODE`, where every (test, path) of
        `needs` holds (`[ -x PATH ]`); else `missing`."""
        tests = [bit for test, path in needs for bit in ("[", test, QuoteString(path), "] &&")]
        return StringCommand("if", *tests, "true; then", *command, '2>&1; echo "exit=$?"; else echo missing; fi')

    @staticmethod
    def parse(lines) -> dict:
        lines = [line.rstrip() for line in lines if line.strip()]
        if lines == ["missing"]:
            return {"exit": None, "lines": []}
        code = None
        if lines and lines[-1].startswith("exit="):
            code = int(lines.pop()[len("exit=") :])
        return {"exit": code, "lines": lines}


class CudaHeaderCheck(ToolResult):
    """`glm-flash-fix-cuda-header --check` on the host: {"exit": int|None, "lines": [...]}.

    exit is None when the command is not installed yet (first deploy); 0 nothing to do;
    1 a header needs the fix; 2 a header is not as expected (the fix refuses it).
    """

    def command(self, tool: str):
        return self.ran([("-x", tool)], QuoteString(tool), "--check")
