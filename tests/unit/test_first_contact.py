"""First contact: the example inventories as a new user runs them, before and after filling them
in as the README says. Every mistake ends before any host is contacted, with the key and the fix,
and without a traceback. The real pyinfra CLI loads each inventory; nothing here can connect
(the host names do not resolve and every run stops while the inventory loads)."""

from __future__ import annotations

import pytest

from control.profile import ProfileError, build
from tests.unit.first_contact import REPO, filled, load, user_home


def refused(run) -> str:
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert "no host was changed" in out and "Traceback" not in out and "Connecting to hosts" not in out, out
    return out


@pytest.mark.parametrize("example, host", [("l40s.py", "gpu1.example.lan"), ("gb10.py", "gx10.example.lan")])
def test_examples_as_shipped_are_refused_before_connecting(tmp_path, example, host):
    home = tmp_path / "empty-home"  # no ~/.ssh/id_ed25519 yet
    home.mkdir()
    out = refused(load(REPO / "inventory" / example, home, pyinfra=True))
    assert f"{host}: (host name): '{host}' is the example inventory's placeholder" in out
    assert f"{host}: ssh_key: '~/.ssh/id_ed25519' does not exist on this machine" in out
    assert "ssh-keygen -t ed25519" in out
    if not (REPO / "inventory" / "local" / "known_hosts").exists():
        assert f"{host}: ssh_known_hosts_file: 'inventory/local/known_hosts' does not exist" in out
    if example == "gb10.py":
        assert f"{host}: vllm_ref: is the example inventory's placeholder" in out
        assert f"{host}: accept_drafter_license:" in out and "CC-BY-NC-ND-4.0" in out


@pytest.mark.parametrize("example", ["l40s.py", "gb10.py"])
def test_filled_in_examples_load(tmp_path, example):
    """Filled in as the README says, with no python_source (no pyenv on the user's machine)."""
    run = load(filled(example, tmp_path), user_home(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr


def test_missing_ssh_key_names_the_key_and_the_fix(tmp_path):
    inv = filled("l40s.py", tmp_path, **{'"~/.ssh/id_ed25519"': '"~/.ssh/id_work"'})
    out = refused(load(inv, user_home(tmp_path), pyinfra=True))
    assert "gpu1.lan: ssh_key: '~/.ssh/id_work' does not exist on this machine" in out
    assert "ssh-copy-id" in out


def test_missing_known_hosts_names_the_readme_step(tmp_path):
    inv = filled("l40s.py", tmp_path)
    (inv.parent / "known_hosts").unlink()
    out = refused(load(inv, user_home(tmp_path), pyinfra=True))
    assert "gpu1.lan: ssh_known_hosts_file: 'inventory/local/known_hosts' does not exist" in out
    assert "First real host" in out


def test_gb10_licence_is_the_users_decision(tmp_path):
    inv = filled("gb10.py", tmp_path, **{'"accept_drafter_license": True': '"accept_drafter_license": False'})
    out = refused(load(inv, user_home(tmp_path), pyinfra=True))
    assert "gx10.lan: accept_drafter_license:" in out
    assert (REPO / "inventory" / "gb10.py").read_text().count('"accept_drafter_license": False') == 1


def test_a_host_named_as_an_address_is_checked_too(tmp_path):
    inv = filled(
        "l40s.py", tmp_path, **{'"ssh_user": "glm",': '"ssh_user": "glm", "ssh_hostname": "10.0.0.5.example.lan",'}
    )
    out = refused(load(inv, user_home(tmp_path)))
    assert "gpu1.lan: ssh_hostname: '10.0.0.5.example.lan' is the example inventory's placeholder" in out


@pytest.mark.parametrize(
    "data, expected",
    [
        ({"python_release": "3.12.8"}, "'3.12.8' is not a CPython 3.11.N release"),
        ({"python_release": "3.11"}, "'3.11' is not a CPython 3.11.N release"),
        ({"python_version": "3.12"}, "'3.11.18' is not a CPython 3.12.N release"),
    ],
)
def test_python_release_matches_python_version(data, expected):
    with pytest.raises(ProfileError) as e:
        build("gpu1", data, api_key_present=False)
    (problem,) = e.value.problems
    assert problem.key == "python_release" and expected in problem.problem and "uv python list" in problem.fix


def test_json_run_of_a_refused_inventory_prints_a_json_error(tmp_path):
    """pyinfra --json: a script reads stdout as JSON; a refused inventory gives it an error object
    with each problem, not an empty stdout (the text for a person still goes to stderr)."""
    import json
    import os
    import subprocess
    import sys

    home = tmp_path / "empty-home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(REPO))
    env.pop("GLM_FLASH_API_KEY", None)
    cmd = [sys.executable, "-m", "pyinfra", "--json", "-y", str(REPO / "inventory/l40s.py"), str(REPO / "deploy.py")]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "no host was changed" in run.stderr
    body = json.loads(run.stdout)
    assert body["error"] == "inventory refused; no host was changed"
    keys = {(p["host"], p["key"]) for p in body["problems"]}
    assert ("gpu1.example.lan", "ssh_key") in keys and all(p["fix"] for p in body["problems"])


def test_make_show_prints_each_value_with_its_source(tmp_path):
    """make show: every resolved setting and where it came from, as ansible-inventory --host does."""
    import os
    import subprocess
    import sys

    inv = filled(
        "gb10.py", tmp_path, **{'"accept_drafter_license": True,': '"accept_drafter_license": True, "port": 8100,'}
    )
    home = user_home(tmp_path)
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(REPO))
    checkout = inv.parents[2]
    run = subprocess.run(
        [sys.executable, str(REPO / "scripts/show.py"), str(inv)], cwd=checkout, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    lines = {line.split()[0]: line for line in run.stdout.splitlines()[1:]}
    assert lines["port"].split()[1:] == ["8100", "#", "inventory"]
    assert lines["gpu_count"].split()[1:] == ["1", "#", "platform", "gb10"]
    assert lines["metrics"].split()[1:] == ["true", "#", "default"]
    assert lines["_sudo"].split()[1:] == ["true", "#", "inventory", "(pyinfra)"]
