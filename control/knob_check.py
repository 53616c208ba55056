"""One knob's value against its shape (control/defaults.py `Knob`): type, pattern, bounds and
choices (the platform's own where it has them), and a key no knob names, with a "did you mean"."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from control.connection import PYINFRA_VERSION, looks_like_pyinfra_key, pyinfra_keys
from control.defaults import HOST_PATH, KNOBS, LOCAL_PATH, Knob
from control.layout import REPO
from control.problems import Problem, control_char, non_ascii, of_kind, safe_repr


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _shape_fix(knob: Knob, text: str) -> str:
    """A fix that says what to write: the path made absolute, or a value of the right shape."""
    if knob.pattern in (HOST_PATH["pattern"], LOCAL_PATH["pattern"]) and not text.startswith(("/", "~")):
        example = f"/{text}" if knob.pattern == HOST_PATH["pattern"] else str(REPO / text)
        return f"write an absolute path, e.g. {safe_repr(example)}, of letters, digits and . _ + -"
    example = knob.default[0] if isinstance(knob.default, list) and knob.default else knob.default
    if isinstance(example, str) and example:
        return f"write {knob.shape}, like {example!r}"
    return f"write {knob.shape}"


def _check_string(host: str, key: str, knob: Knob, text: str) -> Problem | None:
    bad = control_char(text)
    if bad:
        return Problem(host, key, f"{safe_repr(text)} contains {bad}", "remove it: a value is one line of plain text")
    if knob.pattern and not (text == "" and knob.optional) and not re.fullmatch(knob.pattern, text):
        odd = non_ascii(text)
        found = f" (it contains {odd}, not ASCII)" if odd else ""
        return Problem(host, key, f"{safe_repr(text)} is not {knob.shape}{found}", _shape_fix(knob, text))
    return None


def check_value(host: str, key: str, knob: Knob, value: Any, platform: str = "") -> Problem | None:
    if value is None:
        if knob.optional:
            return None
        return Problem(host, key, "must not be None", f"set it to {knob.default!r} ({knob.why}) or remove the key")
    if not of_kind(value, knob.kind):
        return Problem(
            host,
            key,
            f"{safe_repr(value)} is {type(value).__name__}, expected {_type_name(knob.kind)}",
            f"write it like the default {knob.default!r}",
        )
    if isinstance(value, float) and not math.isfinite(value):
        return Problem(
            host, key, f"{value!r} is not a finite number", f"write a number like the default {knob.default!r}"
        )
    for i, text in enumerate(value if isinstance(value, list) else [value]):
        if knob.items is not None and (not isinstance(text, knob.items) or isinstance(text, bool)):
            return Problem(
                host,
                key,
                f"item {i + 1}, {safe_repr(text)}, is {type(text).__name__}, expected {_type_name(knob.items)}",
                f"write it like the default {knob.default!r}",
            )
        if isinstance(text, str):
            problem = _check_string(host, key, knob, text)
            if problem:
                return problem
        elif knob.pattern:  # a list of strings of a shape: an item of another type is not one
            return Problem(
                host,
                key,
                f"item {i + 1}, {safe_repr(text)}, is {type(text).__name__}, not {knob.shape}",
                "write every item as a string in quotes",
            )
    # Bounds and choices: the platform's own where it has them (`On`), saying so.
    on = knob.platforms.get(platform)

    def said(field: str) -> str:
        return f" on {platform} ({on.why})" if on and getattr(on, field) not in (None, ()) else ""

    choices = (on.choices if on else ()) or knob.choices
    if choices and value not in choices:
        near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        listed = ", ".join(map(repr, choices))
        return Problem(
            host,
            key,
            f"{safe_repr(value)} is not one of {listed}{said('choices')}",
            f"{hint}use one of the listed values",
        )
    low = on.low if on and on.low is not None else knob.low
    high = on.high if on and on.high is not None else knob.high
    for item in value if isinstance(value, list) else [value]:  # a list's bounds hold for each item
        what = f"{item!r} in {safe_repr(value)}" if isinstance(value, list) else repr(item)
        if low is not None and item < low:
            return Problem(host, key, f"{what} is below the minimum {low}{said('low')}", f"use values from {low} up")
        if high is not None and item > high:
            return Problem(host, key, f"{what} is above the maximum {high}{said('high')}", f"use values up to {high}")
    return None


def unknown_key(host: str, key: Any) -> Problem:
    if not isinstance(key, str):
        return Problem(
            host, safe_repr(key), "is not a key (keys are strings)", "write the key in quotes, e.g. 'tp_size'"
        )
    bad = control_char(key)
    if bad:
        return Problem(host, safe_repr(key), f"the key contains {bad}", "retype the key")
    near = difflib.get_close_matches(key, [*KNOBS, *(pyinfra_keys() or ())], n=1, cutoff=0.6)
    odd = non_ascii(key)
    if odd:
        return Problem(
            host,
            key,
            f"unknown key: it contains {odd}, a non-ASCII character (a lookalike of a plain letter?)",
            f"retype it in plain ASCII{f' as {near[0]!r}' if near else ''}",
        )
    if looks_like_pyinfra_key(key):
        return Problem(
            host,
            key,
            f"unknown key: not one that pyinfra {PYINFRA_VERSION} reads (pyinfra would ignore it silently)",
            f"did you mean {near[0]!r}?" if near else "see pyinfra's connector documentation for the keys it reads",
        )
    fix = f"did you mean {near[0]!r}?" if near else "remove it; control/defaults.py lists every key"
    return Problem(host, key, "unknown key", fix)


def set_values(
    host: str, knobs: dict[str, Knob], data: dict, values: dict[str, Any], platform: str = "", unknown=unknown_key
) -> list[Problem]:
    """Check each of `data`'s values against its knob in `knobs` and set those that pass into
    `values` (a float knob's whole number as a float); a key no knob names is `unknown(host, key)`.
    The problems, in `data`'s order."""
    problems = []
    for key, value in data.items():
        knob = knobs.get(key) if isinstance(key, str) else None
        problem = unknown(host, key) if knob is None else check_value(host, key, knob, value, platform)
        if problem:
            problems.append(problem)
        else:
            values[key] = float(value) if knob.kind is float else value
    return problems
