"""Write docs/knobs.md (`make knobs-doc`), rendered from control/defaults.py: every knob's default,
why, shape and per-platform value, in the order and sections of that file.

The reference is generated, never edited: `make knobs-doc` writes it, and
tests/unit/test_knob_reference.py fails when the committed file differs from what the knobs
say now (a knob added, a default or a bound changed without running the target). The sections
are the `# --- title ---` comment lines of defaults.py's KNOBS block, read from its source,
because a comment is what a reader of that file sees too; a knob defined before the first
section comment (none today) is listed under "Other".
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from control import defaults  # noqa: E402
from control.defaults import KNOBS, PLATFORMS, Knob, On  # noqa: E402
from control.fleet import GATEWAY_KNOBS  # noqa: E402

_SECTION = re.compile(r"^\s*# --- (?P<title>.+?) -*\s*$")
_KEY = re.compile(r'^    "(?P<key>[a-z0-9_]+)": K\(')


def sections() -> dict[str, str]:
    """knob name -> the section title it is defined under in defaults.py."""
    found: dict[str, str] = {}
    title = "Other"
    for line in Path(defaults.__file__).read_text().splitlines():
        if line.startswith("PLATFORMS"):
            break
        if m := _SECTION.match(line):
            title = m["title"]
        elif (m := _KEY.match(line)) and m["key"] in KNOBS:
            found[m["key"]] = title
    return found


def _row(*cells: str) -> str:
    """One Markdown table row, each cell's pipes escaped and its line breaks gone."""
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def _value(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return "`[" + ", ".join(str(v) for v in value) + "]`" if value else "`[]`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _number(x) -> str:
    """A bound as written: whole numbers in full (1048576, not 1.04858e+06), others short."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _limits(limits: Knob | On, each: str = "") -> list[str]:
    """A knob's (or a platform's) closed set and bounds, in words."""
    said = ["one of " + ", ".join(f"`{c}`" for c in limits.choices)] if limits.choices else []
    low, high = limits.low, limits.high
    if low is not None and high is not None:
        said.append(f"{each}{_number(low)} to {_number(high)}")
    elif low is not None:
        said.append(f"{each}at least {_number(low)}")
    elif high is not None:
        said.append(f"{each}at most {_number(high)}")
    return said


def shape(knob: Knob) -> str:
    """What an inventory may set, in words: type, closed set, bounds or pattern."""
    kinds = knob.kind if isinstance(knob.kind, tuple) else (knob.kind,)
    parts = [" or ".join(k.__name__ for k in kinds) + (f" of {knob.items.__name__}" if knob.items else "")]
    parts += _limits(knob, "each " if knob.items else "")
    if knob.shape:
        parts.append(("each item " if list in kinds else "") + knob.shape)
    if knob.optional:
        parts.append("may be unset")
    return "; ".join(parts)


def per_platform(key: str, knob: Knob) -> str:
    """Where a platform's default or bounds differ from the one above."""
    said = []
    for name in sorted(PLATFORMS):
        bits = []
        if key in PLATFORMS[name]:
            bits.append("default " + _value(PLATFORMS[name][key]))
        on = knob.platforms.get(name)
        if on is not None:
            bits += _limits(on)
        if bits:
            said.append(f"**{name}**: " + ", ".join(bits) + (f" ({on.why})" if on is not None else ""))
    return "; ".join(said)


def render() -> str:
    where = sections()
    order = list(dict.fromkeys(where.get(key, "Other") for key in KNOBS))  # the sections, as they come
    lines = [
        "# Knob reference",
        "",
        "Every key an inventory entry may set, generated from `control/defaults.py` by `make knobs-doc`",
        "(do not edit by hand: `tests/unit/test_knob_reference.py` fails when this file is stale).",
        "Defaults are the L40S field report's; **Per platform** says what a platform sets instead",
        "(`platform: gb10`) or where its bounds differ. A value outside its shape stops the run",
        "before any host is contacted, naming the host, the key, the problem and the fix.",
        "",
        f"{len(KNOBS)} knobs.",
    ]
    for title in order:
        lines += [
            "",
            f"## {title[0].upper()}{title[1:]}",
            "",
            "| Knob | Default | Why | Shape | Per platform |",
            "|---|---|---|---|---|",
        ]
        for key, knob in KNOBS.items():
            if where.get(key, "Other") != title:
                continue
            lines.append(_row(f"`{key}`", _value(knob.default), knob.why, shape(knob), per_platform(key, knob)))
    shared = [key for key in GATEWAY_KNOBS if key in KNOBS]
    lines += [
        "",
        "## The fleet's gateway",
        "",
        "The gateway entry of a fleet inventory (`control/fleet.py`, docs/fleet.md) runs no engine: it takes",
        f"these {len(GATEWAY_KNOBS)} knobs instead of the node's ({', '.join(f'`{k}`' for k in shared)}: as above).",
        "",
        "| Knob | Default | Why | Shape |",
        "|---|---|---|---|",
    ]
    for key, knob in GATEWAY_KNOBS.items():
        if key not in KNOBS:
            lines.append(_row(f"`{key}`", _value(knob.default), knob.why, shape(knob)))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    target = REPO / "docs" / "knobs.md"
    target.write_text(render())
    print(f"wrote {target.relative_to(REPO)}")
