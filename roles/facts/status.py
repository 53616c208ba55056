"""What the host itself says it serves (glm-flash status), for the end-of-deploy summary."""

from __future__ import annotations

import json

from pyinfra.api import QuoteString, StringCommand

from roles.facts import ParsedFact


class HostStatus(ParsedFact):
    """`glm-flash status --json --quick` (its items; the engine environment's files are not hashed),
    or {} before the tool is installed."""

    def command(self, tool: str):
        return StringCommand(
            "if [ -x", QuoteString(tool), "]; then", QuoteString(tool), "status --json --quick; fi; true"
        )

    empty_parsed = True

    @staticmethod
    def parse(lines) -> dict:
        try:
            return json.loads("\n".join(lines))
        except ValueError:
            return {}


class Answers(ParsedFact):
    """True when the host runs a command now. Read directly, never from the run's memo: the
    summary's status may come from the run's first read, and a host gone since must fail here."""

    command = "echo answers"

    @staticmethod
    def parse(lines) -> bool:
        return lines == ["answers"]
