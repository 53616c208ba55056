"""What a refusal says: the host, the key, the problem and the fix, one line each."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any

# Python's unicodedata has no names for control characters (category Cc): the common ones.
CONTROL_NAMES = {
    "\0": "NULL",
    "\t": "CHARACTER TABULATION (tab)",
    "\n": "LINE FEED (newline)",
    "\v": "LINE TABULATION",
    "\f": "FORM FEED",
    "\r": "CARRIAGE RETURN",
    "\x1b": "ESCAPE",
    "\x7f": "DELETE",
}


@dataclass(frozen=True)
class Problem:
    host: str
    key: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.host}: {self.key}: {self.problem}. Fix: {self.fix}"


class ProfileError(Exception):
    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


def char_name(ch: str) -> str:
    """'U+0430 CYRILLIC SMALL LETTER A', 'U+000A LINE FEED (newline)'."""
    name = CONTROL_NAMES.get(ch) or unicodedata.name(ch, "") or "a control character"
    return f"U+{ord(ch):04X} {name}"


def is_control(ch: str) -> bool:
    """Control (Cc) and invisible format characters (Cf: zero-width, bidirectional overrides)."""
    return unicodedata.category(ch) in ("Cc", "Cf")


def control_char(text: str) -> str | None:
    """How to name the first control character in `text`, or None."""
    return next((char_name(ch) for ch in text if is_control(ch)), None)


def strings(value: Any):
    """Every string in a value, however nested in lists, tuples and dicts (keys too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            yield from strings(v)


def of_kind(value: Any, kinds: type | tuple) -> bool:
    """`value` is of the type (or one of the types) `kinds` as an inventory means them: a bool is
    no number, and a whole number is a float too."""
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds) or (float in kinds and isinstance(value, int))


def non_ascii(text: str) -> str | None:
    """How to name the first non-ASCII character in `text` (a lookalike such as Cyrillic 'а'), or None."""
    return next((char_name(ch) for ch in text if ord(ch) > 127), None)


def safe_repr(value: Any, limit: int = 60) -> str:
    """A value for a message: repr() escapes control characters, so the message stays one line."""
    shown = repr(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
