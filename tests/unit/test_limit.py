"""`--limit` and `--exclude` isolate, through the real pyinfra CLI (as test_bad_inventories.py):
a mistake in the entry of a host the run does not target is printed as a warning and the run goes
on for the hosts it targets; a mistake in a targeted host still ends the run before any host is
contacted. Each host's address is a loopback listener that counts connections: the run that goes
on is seen connecting (to the good host only: its SSH handshake then fails, which is not what is
tested here), the refused run is seen not connecting at all.
"""

from __future__ import annotations

import pytest

from tests.unit.test_bad_inventories import Listener, pyinfra, write

BAD = {"tp_szie": 2}  # an unknown key (test_bad_inventories: "typo-knob")


def inventory(tmp_path, port: int, helper: bool):
    ssh = {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_strict_host_key_checking": "yes"}
    good = ("good-host", ssh)
    bad = ("bad-host", {**ssh, **BAD})
    if helper:
        source = f"from control.profile import hosts\n\ngpus = hosts({good!r})\nothers = hosts({bad!r})\n"
    else:
        source = f"gpus = [{good!r}]\nothers = [{bad!r}]\n"
    return write(tmp_path / "inv.py", source)


def run(tmp_path, helper: bool, *options: str):
    listener = Listener()
    try:
        result = pyinfra(inventory(tmp_path, listener.port, helper), "deploy.py", *options)
    finally:
        listener.close()
    return result, listener.connections


@pytest.mark.parametrize(
    "helper, options",
    [
        (True, ("--limit", "good-host")),
        (False, ("--limit", "good-host")),
        (True, ("--limit", "good-*")),
        (True, ("--limit", "gpus")),
        (False, ("--exclude", "bad-host")),
    ],
    ids=["name", "name-plain-list", "pattern", "group", "exclude-plain-list"],
)
def test_a_mistake_outside_the_run_is_a_warning(tmp_path, helper, options):
    result, connections = run(tmp_path, helper, *options)
    out = result.stdout + result.stderr
    assert "hosts outside this run (--limit/--exclude) have inventory mistakes" in out, out
    assert "bad-host: tp_szie:" in out, out
    # (paramiko prints a traceback of the good host's failed handshake: the listener is no SSH server)
    assert "no host was changed" not in out, out
    assert "Connecting to hosts" in out, out
    assert connections == 1, f"{connections} connections: only the good host is in the run\n{out}"


@pytest.mark.parametrize(
    "helper, options",
    [(True, ("--limit", "bad-host")), (False, ("--limit", "others")), (True, ())],
    ids=["name", "group-plain-list", "no-limit"],
)
def test_a_mistake_inside_the_run_still_ends_it_before_contact(tmp_path, helper, options):
    result, connections = run(tmp_path, helper, *options)
    out = result.stdout + result.stderr
    assert result.returncode == 2, out
    assert "no host was changed" in out and "bad-host: tp_szie:" in out, out
    assert "outside this run" not in out and "Connecting to hosts" not in out, out
    assert connections == 0, "a host was contacted"
