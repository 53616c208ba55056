"""What of a deploy is still on a host: paths, units, users and groups, and checkpoint files owned
by someone other than root. One command; the uninstall (roles/uninstall.py) plans from it, so a
second uninstall finds nothing and changes nothing."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from roles.facts import ParsedFact

UNIT_GLOB = "glm-flash*"  # every unit of ours: the service, its GPU gate, the gateway, transient jobs


@dataclass(frozen=True)
class Found:
    paths: frozenset[str] = frozenset()
    units: frozenset[str] = frozenset()  # loaded or with a unit file
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    not_root_owned: frozenset[str] = frozenset()  # of the `owned` directories asked about


class Leftovers(ParsedFact):
    """paths, users, groups: the names to look for; owned: directories whose files should be root's."""

    def command(self, paths=(), users=(), groups=(), owned=()):
        q = shlex.quote
        parts = [f"{{ [ -e {q(p)} ] || [ -L {q(p)} ]; }} && echo path {q(p)}" for p in paths]
        parts += [f"getent passwd {q(u)} >/dev/null && echo user {q(u)}" for u in users]
        parts += [f"getent group {q(g)} >/dev/null && echo group {q(g)}" for g in groups]
        parts += [
            f"[ -d {q(d)} ] && [ -n \"$(find {q(d)} ! -user root -print -quit)\" ] && echo owned {q(d)}" for d in owned
        ]
        glob = q(UNIT_GLOB)
        parts.append(
            f"{{ systemctl list-units --all --plain --no-legend {glob}; "
            f"systemctl list-unit-files --plain --no-legend {glob}; }} 2>/dev/null | awk '{{print \"unit \" $1}}'"
        )
        return "; ".join(f"{{ {p}; }}" for p in parts) + "; true"

    @staticmethod
    def default():
        return Found()

    @staticmethod
    def parse(lines) -> Found:
        kinds: dict[str, set[str]] = {"path": set(), "unit": set(), "user": set(), "group": set(), "owned": set()}
        for line in lines:
            kind, _, value = line.strip().partition(" ")
            if kind in kinds and value:
                kinds[kind].add(value)
        return Found(
            frozenset(kinds["path"]),
            frozenset(kinds["unit"]),
            frozenset(kinds["user"]),
            frozenset(kinds["group"]),
            frozenset(kinds["owned"]),
        )
