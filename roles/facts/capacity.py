"""What the box has for the long steps: cores, CPU flags, memory, free disk where the data goes.

One command, one round trip: /proc/cpuinfo and /proc/meminfo, `df` of the nearest existing
directory of each path, `du` of what is already there, complete engine environments.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from pyinfra.api import QuoteString, StringCommand

from roles.facts import ParsedFact


@dataclass(frozen=True)
class Disk:
    mount: str
    free: int  # bytes available to root's non-reserved use (df's "Available")


@dataclass
class Capacity:
    cpus: int = 0  # logical CPUs
    cores: int = 0  # physical cores (one per core id per socket); cpus where the kernel does not say
    flags: frozenset = frozenset()
    mem_total: int = 0  # bytes
    disks: dict = field(default_factory=dict)  # index in paths -> Disk (where that path is or would be)
    used: dict = field(default_factory=dict)  # index in sized -> bytes already there
    complete_envs: int = 0


class BoxCapacity(ParsedFact):
    """`paths`: where data will go (df of each); `sized`: directories whose current size counts
    against what they still need; `envs`: the engine's envs/ directory."""

    def command(self, paths: tuple, sized: tuple, envs: str):
        parts = [
            "echo cpus $(grep -c '^processor' /proc/cpuinfo);",
            "echo cores $(grep -E '^(physical id|core id)' /proc/cpuinfo | paste - - | sort -u | wc -l);",
            "grep -m1 -E '^(flags|Features)' /proc/cpuinfo;",
            "grep '^MemTotal:' /proc/meminfo;",
        ]
        for i, p in enumerate(paths):
            # The nearest existing directory: a first deploy creates the rest on the same filesystem.
            parts += [
                f"p={shlex.quote(p)};",
                'while [ ! -e "$p" ]; do p=$(dirname "$p"); done;',
                f"echo df {i}",
                '$(df -PB1 "$p" | tail -n1 | awk \'{print $4; $1=$2=$3=$4=$5=""; print}\');',
            ]
        for i, p in enumerate(sized):
            parts += ["[ -d", QuoteString(p), f"] && echo du {i} $(du -sb", QuoteString(p), "| cut -f1);"]
        parts += [f"echo envs $(ls -d {shlex.quote(envs)}/*/.glm-flash-complete 2>/dev/null | wc -l);", "true"]
        return StringCommand(*parts)

    @staticmethod
    def parse(lines) -> Capacity:
        c = Capacity()
        for line in lines:
            key, _, rest = line.partition(" ")
            words = rest.split()
            if key == "cpus" and words:
                c.cpus = int(words[0])
            elif key == "cores" and words:
                c.cores = int(words[0])
            elif line.startswith(("flags", "Features")):
                c.flags = frozenset(line.partition(":")[2].split())
            elif key == "MemTotal:" and words:
                c.mem_total = int(words[0]) * 1024
            elif key == "df" and len(words) >= 3 and words[1].isdigit():
                c.disks[int(words[0])] = Disk(mount=" ".join(words[2:]), free=int(words[1]))
            elif key == "du" and len(words) == 2 and words[1].isdigit():
                c.used[int(words[0])] = int(words[1])
            elif key == "envs" and words:
                c.complete_envs = int(words[0])
        c.cores = c.cores or c.cpus  # aarch64 /proc/cpuinfo has no core ids: every CPU is a core
        return c
