"""Values that slipped past the shapes of control/defaults.py: NaN and infinity (every comparison
with them is false, so no bound held), list items that are not strings (the pattern was only
applied to strings), and a plain-http hub with a token set (the token would cross the network in
clear). The same through the real pyinfra CLI: tests/unit/test_bad_inventories.py.
"""

from __future__ import annotations

import pytest

from control.defaults import KNOBS
from control.profile import ProfileError, build

FLOATS = [k for k, knob in KNOBS.items() if knob.kind is float or (isinstance(knob.kind, tuple) and float in knob.kind)]
PATTERN_LISTS = [k for k, knob in KNOBS.items() if knob.kind is list and knob.pattern]


def problems(data) -> list[str]:
    try:
        build("h", data)
    except ProfileError as e:
        return [str(p) for p in e.problems]
    return []


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("key", FLOATS)
def test_nan_and_infinity_fail_every_float_knob(key, value):
    assert FLOATS and problems({key: value}) == [
        f"h: {key}: {value!r} is not a finite number. Fix: write a number like the default {KNOBS[key].default!r}"
    ]


@pytest.mark.parametrize("item", [7, None, 1.5, ["gdm3"], {"a": "b"}, True])
@pytest.mark.parametrize("key", PATTERN_LISTS)
def test_a_list_item_that_is_not_a_string_is_refused(key, item):
    good = list(KNOBS[key].default) or {"engine_allow_from": ["10.0.0.1"]}.get(key, ["x"])
    said = problems({key: [*good[:1], item]})
    assert PATTERN_LISTS and len(said) == 1, said
    assert said[0].startswith(f"h: {key}: item 2, ") and f"is {type(item).__name__}, not " in said[0], said
    assert "Fix: write every item as a string in quotes" in said[0]


def test_a_token_is_never_sent_to_a_plain_http_hub(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("MY_TOKEN", raising=False)
    mirror = {"hf_endpoint": "http://hub.lan:8080"}
    assert problems(mirror) == []  # no token: a plain mirror is fine
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    (said,) = problems(mirror)
    assert said.startswith(
        "h: hf_endpoint: http://hub.lan:8080 is plain http and a Hugging Face token is set (HF_TOKEN)"
    )
    assert "hf_secret" not in said and "Fix: use the hub's https:// address" in said
    assert problems({"hf_endpoint": "https://hub.lan:8080"}) == []
    # loopback: the sandbox's stand-in hub; nothing sent there crosses a network
    for url in ("http://127.0.0.1:8080", "http://localhost", "http://[::1]:80"):
        assert problems({"hf_endpoint": url}) == [], url
    monkeypatch.delenv("HF_TOKEN")
    assert problems({**mirror, "hf_token_env": "MY_TOKEN"}) == []
    monkeypatch.setenv("MY_TOKEN", "x")
    assert "token is set (MY_TOKEN)" in problems({**mirror, "hf_token_env": "MY_TOKEN"})[0]
    monkeypatch.delenv("MY_TOKEN")
    vault = tmp_path / "token.vault"
    vault.write_text("$ANSIBLE_VAULT;1.1;AES256\n")
    assert "token is set (hf_token_vault)" in problems({**mirror, "hf_token_vault": str(vault)})[0]
    # a host name that only starts like loopback is not loopback
    monkeypatch.setenv("HF_TOKEN", "x")
    assert problems({"hf_endpoint": "http://127.0.0.1.evil.lan"}) != []
