"""docs/knobs.md is what control/defaults.py says now: a knob added, a default or a bound changed
without `make knobs-doc` fails here. The rendering itself is checked against the knobs directly,
so a reference that drops a knob, a default or a platform's value fails too."""

from pathlib import Path

from control.defaults import KNOBS, PLATFORMS
from scripts.knobs_doc import render, sections

REPO = Path(__file__).resolve().parents[2]


def test_committed_reference_is_current():
    committed = (REPO / "docs" / "knobs.md").read_text()
    assert committed == render(), "docs/knobs.md is stale: run `make knobs-doc` and commit it"


def test_every_knob_has_a_row_in_a_section_of_defaults_py():
    where = sections()
    assert set(where) == set(KNOBS), f"knobs outside a `# --- title ---` section: {set(KNOBS) - set(where)}"
    node = render().split("\n## The fleet's gateway")[0]  # the gateway's own table follows the node's
    rows = [line.split("`")[1] for line in node.splitlines() if line.startswith("| `")]
    assert sorted(rows) == sorted(KNOBS) and len(rows) == len(KNOBS)


def test_rows_carry_the_default_and_each_platforms_value():
    rows = {line.split("`")[1]: line for line in render().splitlines() if line.startswith("| `")}
    assert "| `port` | `30000` |" in rows["port"]
    for platform, values in PLATFORMS.items():
        for key, value in values.items():
            shown = str(value).lower() if isinstance(value, bool) else str(value)
            if isinstance(value, list):
                shown = ", ".join(map(str, value))
            assert f"**{platform}**: default `" in rows[key], (platform, key)
            assert shown in rows[key], (platform, key, value)


def test_the_gateways_knobs_are_in_the_reference():
    from control.fleet import GATEWAY_KNOBS
    from scripts.knobs_doc import render

    text = render()
    assert all(f"| `{key}` |" in text for key in GATEWAY_KNOBS)
