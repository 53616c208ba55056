"""apt's view of held packages (pyinfra 3.10 has no such fact) and of the old one-line sources.list."""

from __future__ import annotations

import re

from pyinfra.api.exceptions import FactProcessError

from roles.facts import ParsedFact

# Debian policy 5.6.1: lower case letters, digits, + - . ; at least two characters,
# starting with a letter or digit. apt-mark also takes an architecture qualifier.
PACKAGE_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?$")
LEGACY_SOURCES = "/etc/apt/sources.list"


class AptHeldPackages(ParsedFact):
    """Packages on hold (`apt-mark showhold`): a sorted list of names.

    Native-architecture packages appear bare (`libc6`), foreign ones qualified
    (`libc6:i386`), as apt-mark prints them.
    """

    def command(self):
        return "apt-mark showhold"

    def requires_command(self):
        return "apt-mark"

    empty_parsed = True

    @staticmethod
    def parse(lines) -> list[str]:
        names = set()
        for line in lines:
            name = line.strip()
            if not name:
                continue
            if not PACKAGE_NAME.match(name):
                # apt-mark prints one name per line; anything else is not its output.
                raise FactProcessError(f"unexpected line in `apt-mark showhold` output: {line!r}")
            names.add(name)
        return sorted(names)


class LegacyAptSources(ParsedFact):
    """Active lines of the one-line-style sources.list that would duplicate ours."""

    def command(self):
        return f"grep -Ev '^[[:space:]]*(#|$)' {LEGACY_SOURCES} 2>/dev/null || true"

    @staticmethod
    def parse(lines) -> list[str]:
        return [line for line in lines if line.strip()]


class DpkgInterrupted(ParsedFact):
    """What an interrupted dpkg left: pending journal entries in /var/lib/dpkg/updates (apt then
    refuses every command: "dpkg was interrupted, you must manually run 'dpkg --configure -a'")
    and the packages `dpkg --audit` reports (unpacked or half-configured). Empty when dpkg is clean
    (or not there: DGX OS has it, a non-Debian host would not reach this)."""

    def command(self):
        return (
            "if command -v dpkg >/dev/null; then "
            "echo updates $(ls -A /var/lib/dpkg/updates 2>/dev/null | wc -l); "
            "dpkg --audit 2>&1 | sed 's/^/audit /'; fi; true"
        )

    empty_parsed = True

    @staticmethod
    def parse(lines) -> list[str]:
        """The reasons, one per line; none when dpkg is clean."""
        reasons = []
        audit = []
        for line in lines:
            key, _, rest = line.partition(" ")
            if key == "updates" and rest.strip().isdigit() and int(rest) > 0:
                reasons.append(f"{int(rest)} pending journal file(s) in /var/lib/dpkg/updates")
            elif key == "audit" and rest.strip():
                audit.append(rest.strip())
        if audit:
            reasons.append("dpkg --audit: " + " | ".join(audit)[:400])
        return reasons
