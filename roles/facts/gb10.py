"""Recognising the GB10 box (ASUS Ascent GX10 / DGX Spark) from what it reports.

- `uname -m`: aarch64 (pyinfra's own `server.Arch` fact);
- `nvidia-smi --query-gpu=...`: one GPU with compute capability 12.1 (roles/facts/system.py Gpus);
  its memory.total is "[N/A]": the GPU has no memory of its own, it shares the system's
  (unified memory; roles/facts/system.py parses that as 0 MiB);
- /proc/meminfo MemTotal: what that unified pool is (121.6 GiB usable on the field box);
- /etc/os-release (Ubuntu 24.04, the base of DGX OS) and /etc/dgx-release (DGX OS's own
  release file, from its dgx-release package).

Parsers are static methods; tests feed them recorded output (tests/unit/data/gb10-*).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from roles.facts import ParsedFact

GB10_CAPABILITY = "12.1"
ARCH = "aarch64"
OS_ID, OS_VERSION = "ubuntu", "24.04"


def _kv(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        try:
            value = " ".join(shlex.split(value))
        except ValueError:
            value = value.strip().strip("'\"")
        out[key.strip()] = value
    return out


@dataclass(frozen=True)
class OsInfo:
    id: str
    version_id: str
    pretty: str
    dgx: dict  # /etc/dgx-release's keys: empty when not DGX OS

    def describe(self) -> str:
        dgx = self.dgx.get("DGX_PRETTY_NAME") or self.dgx.get("DGX_NAME")
        version = self.dgx.get("DGX_SWBUILD_VERSION")
        return f"{self.pretty}" + (f" ({dgx} {version})" if dgx else "")


class OsRelease(ParsedFact):
    """/etc/os-release plus DGX OS's /etc/dgx-release (empty elsewhere)."""

    SEP = "--- /etc/dgx-release ---"

    def command(self):
        return f"cat /etc/os-release 2>/dev/null; echo '{self.SEP}'; cat /etc/dgx-release 2>/dev/null; true"

    @staticmethod
    def parse(lines) -> OsInfo:
        lines = list(lines)
        cut = lines.index(OsRelease.SEP) if OsRelease.SEP in lines else len(lines)
        osr, dgx = _kv(lines[:cut]), _kv(lines[cut + 1 :])
        return OsInfo(osr.get("ID", ""), osr.get("VERSION_ID", ""), osr.get("PRETTY_NAME", ""), dgx)


class MemTotalKiB(ParsedFact):
    """MemTotal of /proc/meminfo in KiB (on GB10: the unified pool CPU and GPU share)."""

    def command(self):
        return "grep '^MemTotal:' /proc/meminfo"

    @staticmethod
    def parse(lines) -> int:
        for line in lines:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "MemTotal:" and parts[1].isdigit():
                return int(parts[1])
        return 0


@dataclass(frozen=True)
class Gb10View:
    arch: str
    os: OsInfo
    gpus: tuple
    mem_total_kib: int

    @property
    def unified_memory(self) -> bool:
        """One GPU without memory of its own (nvidia-smi memory.total [N/A])."""
        return len(self.gpus) == 1 and self.gpus[0].memory_mib == 0

    @property
    def unified_gib(self) -> float:
        return round(self.mem_total_kib / 1048576, 1)

    def problems(self, min_gib: float = 110.0) -> list[tuple[str, str, str]]:
        """(what, found, fix) for everything that is not a GB10 box as the profile needs it."""
        out = []
        if self.arch != ARCH:
            fix = "point the GB10 profile (platform: gb10) at the GB10 box, or use platform: l40s here"
            out.append(("architecture", f"uname -m says {self.arch or 'nothing'}", fix))
        if self.os.id != OS_ID or self.os.version_id != OS_VERSION:
            fix = "the GB10 path is written for DGX OS (Ubuntu 24.04); reinstall DGX OS from NVIDIA's recovery image"
            out.append(("operating system", f"{self.os.pretty or 'unknown'}", fix))
        if self.gpus:
            caps = sorted({g.compute_capability for g in self.gpus})
            if caps != [GB10_CAPABILITY]:
                out.append(("GPU", f"compute capability {', '.join(caps)}", "this is not a GB10 (sm_121)"))
            elif not self.unified_memory:
                fix = "a GB10 reports none of its own ([N/A]); check nvidia-smi"
                out.append(("unified memory", f"nvidia-smi reports {self.gpus[0].memory_mib} MiB of GPU memory", fix))
        if self.mem_total_kib and self.unified_gib < min_gib:
            fix = "the model (99.6 GiB) and its KV cache need the box's full 128 GB"
            out.append(("memory", f"{self.unified_gib} GiB in /proc/meminfo", fix))
        return out
