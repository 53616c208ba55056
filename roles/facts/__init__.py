"""Custom pyinfra facts: each a small typed class that runs one command and parses its output.

Parsers are plain static methods (`parse(lines)`) so unit tests feed them real command output.
"""

from __future__ import annotations

from pyinfra.api import FactBase


class ParsedFact(FactBase):
    """A fact whose value is `parse(lines of its command's output)`; subclasses give command and parse."""

    @staticmethod
    def parse(lines):
        raise NotImplementedError

    def process(self, output):
        return self.parse(output)
