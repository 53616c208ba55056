"""engine_extra_args (issue 39): flags passed to the engine as they are, after the profile's own.
Malformed values are refused while the inventory loads (before any host is touched); a flag the
profile sets is refused while the deploy plans; the rest reach the launch spec, whose every flag
the installed engine's parser checks before the switch (tests/sandbox/test_flag_check.py)."""

from __future__ import annotations

from unittest import mock

import pytest

from control.profile import ProfileError, build
from roles.engines.kt import launch as kt_launch
from roles.engines.vllm import launch as vllm_launch

GB10 = {"platform": "gb10", "vllm_ref": "0123456789abcdef0123456789abcdef01234567", "accept_drafter_license": True}


@pytest.mark.parametrize(
    "value, words",
    [
        (["--schedule-policy lpm"], "a command-line word"),  # a space: two words in one item
        (["--json-model-override-args", '{"a":1}'], "a command-line word"),
        (["--x=$(id)"], "a command-line word"),
        ("--enable-torch-compile", "expected a list"),
        (["lpm", "--schedule-policy"], "comes before any flag"),
    ],
)
def test_a_malformed_value_is_refused_while_the_inventory_loads(value, words):
    with pytest.raises(ProfileError) as e:
        build("gpu1", {"engine_extra_args": value}, api_key_present=False)
    (p,) = e.value.problems
    assert p.key == "engine_extra_args" and words in (p.problem + p.fix)


@pytest.mark.parametrize(
    "data, spec_of",
    [({}, lambda p: kt_launch.launch_spec(p, 2)), (GB10, vllm_launch.launch_spec)],
    ids=["l40s", "gb10"],
)
def test_known_flags_follow_the_profiles_own(data, spec_of):
    extra = ["--schedule-policy", "lpm", "--enable-cache-report"]
    p = build("gpu1", {**data, "engine_extra_args": extra}, api_key_present=False)
    spec = spec_of(p)
    assert spec["args"][-3:] == extra and spec["extra_args"] == extra
    plain = spec_of(build("gpu1", data, api_key_present=False))
    assert "extra_args" not in plain  # unset: the launch spec is as before (no restart on upgrade)
    assert spec["args"][:-3] == plain["args"]


@pytest.mark.parametrize("flag", ["--port", "--api-key", "--tp-size", "--model-path", "--port=31000"])
def test_a_flag_the_profile_sets_is_refused(flag):
    p = build("gpu1", {"engine_extra_args": [flag, "1"] if "=" not in flag else [flag]}, api_key_present=False)
    with mock.patch("control.profile.current_host") as h, pytest.raises(SystemExit):
        h.name = "gpu1"
        kt_launch.launch_spec(p, 2)


def test_the_gb10_engines_own_flags_are_refused_too():
    p = build("gx", {**GB10, "engine_extra_args": ["--tensor-parallel-size", "2"]}, api_key_present=False)
    with mock.patch("control.profile.current_host") as h, pytest.raises(SystemExit):
        h.name = "gx"
        vllm_launch.launch_spec(p)
