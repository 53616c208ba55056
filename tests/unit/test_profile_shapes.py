"""Every knob has a shape, checked before any host is contacted (issue #9 item 6).

The parametrized cases run over KNOBS itself, so a knob added to control/defaults.py is covered
(or, without a shape, fails test_every_string_knob_has_a_shape) without touching this file.
"""

from __future__ import annotations

import pyinfra.connectors.ssh
import pytest

from control.connection import pyinfra_keys
from control.defaults import HOST_PATH, KNOBS, LOCAL_PATH, PLATFORMS, PORT_KEYS
from control.profile import ProfileError, build

REF = "0123456789abcdef0123456789abcdef01234567"
GB10 = {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True}
STRING_KNOBS = [k for k, knob in KNOBS.items() if knob.kind is str]
LIST_KNOBS = [k for k, knob in KNOBS.items() if knob.kind is list and knob.pattern]
PATH_KNOBS = [k for k, knob in KNOBS.items() if knob.pattern in (HOST_PATH["pattern"], LOCAL_PATH["pattern"])]
# What must never reach a shell word, a unit file line or an env file line.
HOSTILE = {
    "newline": "\nExecStartPre=+/bin/sh -c id",
    "single quote": "'",
    "double quote": '"',
    "command substitution": "$(id)",
    "systemd specifier": "%n",
    "space": " x",
}


def problems(data, host="gpu1"):
    with pytest.raises(ProfileError) as e:
        build(host, data, api_key_present=False)
    return e.value.problems


def valid(key: str) -> str:
    """A value the knob accepts (its default, or one of its shape)."""
    default = KNOBS[key].default
    return default if default else {"vllm_ref": REF}.get(key, "/srv/x" if key in PATH_KNOBS else "x")


def test_every_string_knob_has_a_shape():
    for key, knob in KNOBS.items():
        strings = knob.kind is str or (knob.kind is list and any(isinstance(v, str) for v in knob.default))
        if strings:
            assert knob.pattern or knob.choices, f"{key}: give it a pattern (control/defaults.py shapes) or choices"
            assert not knob.pattern or knob.shape, f"{key}: say what its pattern means (shape=...)"


def test_every_path_knob_is_checked_as_a_path():
    """Knobs named or valued like paths use a path shape: absolute, safe characters."""
    for key, knob in KNOBS.items():
        looks_like_path = key.endswith(("_path", "_root", "_dir", "_source", "_vault")) or (
            isinstance(knob.default, str) and knob.default.startswith("/")
        )
        if looks_like_path and not knob.choices:
            assert key in PATH_KNOBS, key
    assert {"install_root", "model_path", "drafter_path", "python_source", "triton_configs_dir"} <= set(PATH_KNOBS)


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_defaults_pass_their_own_shapes_on_every_platform(platform):
    data = GB10 if platform == "gb10" else {}
    build("gpu1", data, api_key_present=False)


@pytest.mark.parametrize("bad", list(HOSTILE))
@pytest.mark.parametrize("key", STRING_KNOBS)
def test_every_string_knob_refuses_shell_and_systemd_characters(key, bad):
    value = valid(key) + HOSTILE[bad]
    data = dict(GB10, **{key: value}) if key in ("vllm_ref",) else {key: value}
    found = [p for p in problems(data) if p.key == key]
    assert found, f"{key}={value!r} was accepted"
    assert found[0].host == "gpu1" and found[0].problem and found[0].fix


@pytest.mark.parametrize("bad", list(HOSTILE))
@pytest.mark.parametrize("key", LIST_KNOBS)
def test_every_list_of_names_refuses_them_in_any_item(key, bad):
    value = [*KNOBS[key].default, "ok" + HOSTILE[bad]]
    (problem,) = problems({key: value})
    assert problem.key == key and ("is not" in problem.problem or "contains" in problem.problem)


@pytest.mark.parametrize("key", PATH_KNOBS)
@pytest.mark.parametrize("path", ["srv/models/x", "./x", "/srv/../etc/shadow", "/srv/models/", "/srv/a b", "//srv"])
def test_every_path_knob_refuses_relative_and_unsafe_paths(key, path):
    (problem,) = problems({key: path})
    assert problem.key == key and "absolute path" in problem.problem and problem.fix.startswith("write")


def test_a_relative_path_gets_an_absolute_one_as_its_fix():
    (problem,) = problems({"model_path": "srv/models/x"})
    assert "'/srv/models/x'" in problem.fix


@pytest.mark.parametrize("char", ["\n", "\r", "\t", "\x00", "\x1b", "\u200b", "\u202e"])
def test_control_and_invisible_characters_are_named_anywhere(char):
    (p,) = problems({"served_model_name": f"glm{char}flash"})
    assert p.key == "served_model_name" and "U+" in p.problem
    (p,) = problems({"ssh_user": f"ro{char}ot"})
    assert p.key == "ssh_user" and "U+" in p.problem
    (p,) = problems({"base_packages": ["curl", f"jq{char}"]})
    assert p.key == "base_packages" and "U+" in p.problem


def test_newline_is_named_by_its_name():
    (p,) = problems({"served_model_name": "a\nb"})
    assert "U+000A LINE FEED (newline)" in p.problem and "'a\\nb'" in p.problem


def test_a_lookalike_letter_in_a_key_is_named():
    (p,) = problems({"model_p\u0430th": "/srv/x"})
    assert p.key == "model_p\u0430th" and "U+0430 CYRILLIC SMALL LETTER A" in p.problem
    assert "'model_path'" in p.fix


def test_a_lookalike_letter_in_a_value_is_named():
    (p,) = problems({"service_user": "glm-fl\u0430sh"})
    assert "U+0430 CYRILLIC SMALL LETTER A" in p.problem


def test_pyinfra_keys_come_from_the_installed_pyinfra():
    known = pyinfra_keys()
    assert set(pyinfra.connectors.ssh.connector_data_meta) <= set(known)
    assert known["ssh_port"] is int and "_sudo" in known
    build("gpu1", {"ssh_connect_retries": 2, "ssh_forward_agent": False, "_sudo": True}, api_key_present=False)


@pytest.mark.parametrize(
    "key, near",
    [
        ("ssh_known_host_file", "ssh_known_hosts_file"),
        ("ssh_strict_host_key_check", "ssh_strict_host_key_checking"),
        ("ssh_prot", "ssh_port"),
        ("ssh_hostnmae", "ssh_hostname"),
        ("_sudo_usr", "_sudo_user"),
    ],
)
def test_a_misspelled_pyinfra_key_is_refused(key, near):
    (p,) = problems({key: "x"})
    assert p.key == key and "not one that pyinfra" in p.problem and f"did you mean {near!r}" in p.fix


@pytest.mark.parametrize(
    "data, key, words",
    [
        ({"ssh_port": "22"}, "ssh_port", "pyinfra expects int"),
        ({"ssh_port": 70000}, "ssh_port", "not a TCP port"),
        ({"ssh_hostname": "gpu1 lan"}, "ssh_hostname", "not a host name"),
        ({"ssh_strict_host_key_checking": "maybe"}, "ssh_strict_host_key_checking", "not one of"),
        ({"ssh_allow_agent": "no"}, "ssh_allow_agent", "pyinfra expects bool"),
        # a password pyinfra would put on the host's command line (issue 39)
        ({"ssh_user": "glm", "_sudo": True, "_sudo_password": "pw"}, "_sudo_password", "command line"),
        ({"ssh_password": "pw"}, "ssh_password", "every user of it can read"),
        # a user that is not root, without sudo: the deploy would fail at its first root step
        ({"ssh_user": "glm"}, "_sudo", "is not root and _sudo is not set"),
        ({"ssh_user": "glm", "_sudo": False}, "_sudo", "is not root and _sudo is not set"),
    ],
)
def test_pyinfra_values_have_pyinfras_types_and_a_shape(data, key, words):
    (p,) = problems(data)
    assert p.key == key and words in p.problem


@pytest.mark.parametrize(
    "data, key, words",
    [
        ({**GB10, "gpu_count": 2}, "gpu_count", "above the maximum 1 on gb10 (the GB10 box has one GPU)"),
        ({**GB10, "tp_size": 2}, "tp_size", "above the maximum 1 on gb10"),
        ({**GB10, "python_version": "3.11"}, "python_version", "on gb10"),
        ({**GB10, "cuda_version": "12.8"}, "cuda_version", "on gb10"),
        ({**GB10, "gpu_compute_capability": "8.9"}, "gpu_compute_capability", "on gb10"),
        ({"gpu_compute_capability": "12.1"}, "gpu_compute_capability", "on l40s"),
    ],
)
def test_bounds_that_hold_on_one_platform_only(data, key, words):
    (p,) = problems(data)
    assert p.key == key and words in p.problem


def test_the_same_values_hold_on_the_other_platform():
    build("gpu1", {"gpu_count": 2, "tp_size": 2, "python_version": "3.11"}, api_key_present=False)
    build("gx10", {**GB10, "gpu_compute_capability": "12.1"}, api_key_present=False)


def test_service_ports_do_not_collide_with_ssh_or_each_other():
    assert "port" in PORT_KEYS
    (p,) = problems({"port": 2222, "ssh_port": 2222})
    assert p.key == "port" and "the port SSH connects to" in p.problem
    (p,) = problems({"port": 22})
    assert p.key == "port" and "below the minimum 1024" in p.problem
    build("gpu1", {"port": 2222, "ssh_port": 22}, api_key_present=False)


def test_control_characters_nested_in_pyinfra_values_are_named():
    (p,) = problems({"_env": {"PATH": "/usr/bin\n/evil"}})
    assert p.key == "_env" and "U+000A LINE FEED" in p.problem
