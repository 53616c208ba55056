"""A user account as the system resolves it (getent and id): one cheap read instead of pyinfra's Users.

pyinfra's Users fact walks every account and runs lastlog for each (about 0.4 s per read).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from roles.facts import ParsedFact


@dataclass(frozen=True)
class AccountInfo:
    home: str
    shell: str
    group: str
    groups: frozenset[str]  # secondary groups


class Account(ParsedFact):
    """None when the account does not exist."""

    def command(self, user):
        u = shlex.quote(user)
        return f"getent passwd {u} || exit 0; echo primary $(id -gn {u}); echo groups $(id -Gn {u})"

    @staticmethod
    def parse(lines):
        entry = lines[0].split(":")
        fields = dict(line.split(" ", 1) if " " in line else (line, "") for line in lines[1:])
        primary = fields.get("primary", "").strip()
        groups = frozenset(fields.get("groups", "").split()) - {primary}
        return AccountInfo(home=entry[5], shell=entry[6], group=primary, groups=groups)
