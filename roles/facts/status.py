"""What the host itself says it serves (glm-flash status), for the end-of-deploy summary."""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand


class HostStatus(FactBase):
    """`glm-flash status --json --quick` (its items; the engine environment's files are not hashed),
    or {} before the tool is installed."""

    def command(self, tool: str):
        return StringCommand(
            "if [ -x", QuoteString(tool), "]; then", QuoteString(tool), "status --json --quick; fi; true"
        )

    @staticmethod
    def default():
        return {}

    def process(self, output):
        try:
            return json.loads("\n".join(output))
        except ValueError:
            return {}
