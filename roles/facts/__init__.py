"""Custom pyinfra facts: each a small typed class that runs one command and parses its output.

Parsers are plain static methods (`parse(lines)`) so unit tests feed them real command output.
"""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString


def flags(**values) -> list:
    """`--name value` for each keyword in order (its underscores as dashes), each value quoted for the
    shell: the options of a host tool's command line."""
    return [bit for key, value in values.items() for bit in (f"--{key.replace('_', '-')}", QuoteString(value))]


def fields(lines, n: int, sep: str | None = None) -> list[list[str]]:
    """The lines of exactly `n` fields (split at `sep`, at blanks by default), each field stripped."""
    return [parts for parts in ([p.strip() for p in line.split(sep)] for line in lines) if len(parts) == n]


class ParsedFact(FactBase):
    """A fact whose value is `parse(lines of its command's output)`; subclasses give command and parse.
    With `empty_parsed`, a command that prints nothing has the value `parse([])` (no GPUs, no held
    packages, ...); without, None, pyinfra's default (where nothing means "not there")."""

    empty_parsed = False

    @staticmethod
    def parse(lines):
        raise NotImplementedError

    @classmethod
    def default(cls):
        return cls.parse([]) if cls.empty_parsed else None

    def process(self, output):
        return self.parse(output)
