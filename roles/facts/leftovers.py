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
    units: frozenset[str] = frozenset()  # with a unit file, or loaded and not merely a name (below)
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    not_root_owned: frozenset[str] = frozenset()  # of the `owned` directories asked about
    links: frozenset[str] = frozenset()  # links in `link_dir` pointing under `link_target`
    # of `units`, those systemd made from systemd-run (a file in /run/systemd/transient while loaded)
    transient: frozenset[str] = frozenset()


class Leftovers(ParsedFact):
    """paths, users, groups: the names to look for; owned: directories whose files should be root's."""

    def command(self, paths=(), users=(), groups=(), owned=(), link_dir=None, link_target=None):
        q = shlex.quote
        parts = [f"{{ [ -e {q(p)} ] || [ -L {q(p)} ]; }} && echo path {q(p)}" for p in paths]
        parts += [f"getent passwd {q(u)} >/dev/null && echo user {q(u)}" for u in users]
        parts += [f"getent group {q(g)} >/dev/null && echo group {q(g)}" for g in groups]
        parts += [
            f"[ -d {q(d)} ] && [ -n \"$(find {q(d)} ! -user root -print -quit)\" ] && echo owned {q(d)}" for d in owned
        ]
        if link_dir and link_target:
            # Every link of ours, whatever its name (glm-flash-rollback is one no file in files/ has).
            parts.append(
                f"find {q(link_dir)} -maxdepth 1 -type l -lname {q(link_target.rstrip('/') + '/*')} "
                "-printf 'link %p\\n' 2>/dev/null"
            )
        glob = q(UNIT_GLOB)
        parts.append(
            f"systemctl list-units --all --plain --no-legend {glob} 2>/dev/null"
            " | awk '{print \"loaded \" $1 \" \" $2 \" \" $3}'"
        )
        parts.append(
            f"systemctl list-unit-files --plain --no-legend {glob} 2>/dev/null | awk '{{print \"unit \" $1 \" \" $2}}'"
        )
        return "; ".join(f"{{ {p}; }}" for p in parts) + "; true"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> Found:
        kinds: dict[str, set[str]] = {k: set() for k in ("path", "unit", "user", "group", "owned", "link", "transient")}
        for line in lines:
            kind, _, value = line.strip().partition(" ")
            if kind == "loaded":
                # NAME LOAD ACTIVE. A unit with no file that does not run (not-found inactive) is only
                # a name systemd holds while something refers to it, until it collects it: nothing to
                # stop, disable or reset, so no change for a second uninstall to report.
                name, load, active = (value.split() + ["", ""])[:3]
                if name and (load, active) != ("not-found", "inactive"):
                    kinds["unit"].add(name)
            elif kind == "unit":
                name, state = (value.split() + [""])[:2]
                if name:
                    kinds["unit"].add(name)
                if name and state == "transient":
                    kinds["transient"].add(name)
            elif kind in kinds and value:
                kinds[kind].add(value)
        return Found(*map(frozenset, kinds.values()))  # kinds in Found's order
