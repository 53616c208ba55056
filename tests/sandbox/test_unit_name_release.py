"""A fixed transient unit name taken again (roles/operations/job.py name_released), on Debian 13's
real systemd 257: the peer servers, the fleet's fetches and the download and receive units each
reuse their name from run to run, and systemd refuses a name it still holds ("already loaded or
has a fragment file"; seen once in a cold CI run, a peer server of an earlier run still loaded).
"""

from __future__ import annotations

import shlex

import pytest

from roles.operations.job import name_released
from tests.conftest import sandbox_sh

pytestmark = pytest.mark.sandbox
UNIT = "glm-flash-test-name-release"


def start(extra: str = "") -> None:
    sandbox_sh(f"systemd-run --quiet --collect --service-type=exec --unit {UNIT} {extra} -- sleep 300")


def test_a_running_unit_of_the_name_is_stopped_and_the_name_taken_again(sandbox):
    start()
    assert sandbox_sh(f"systemctl is-active {UNIT}").stdout.strip() == "active"
    # the second start as the deploy's commands run it: released first, then systemd-run
    r = sandbox_sh(
        f"{name_released(UNIT + '.service')}; systemd-run --quiet --collect --service-type=exec --unit {UNIT} "
        "-p Description=second -- sleep 300",
        check=False,
    )
    try:
        assert r.returncode == 0, r.stderr
        shown = sandbox_sh(f"systemctl show -P Description {UNIT}").stdout.strip()
        assert shown == "second", f"the unit running is not the second one: {shown!r}"
    finally:
        sandbox_sh(f"systemctl stop {UNIT}", check=False)
    # without the release, systemd refuses the name while the first still runs (what the wait is for)
    start()
    try:
        r = sandbox_sh(f"systemd-run --quiet --collect --unit {UNIT} -- sleep 1", check=False)
        assert r.returncode != 0 and "already" in r.stderr, (r.returncode, r.stderr)
    finally:
        sandbox_sh(f"systemctl stop {UNIT}", check=False)


def test_a_name_systemd_keeps_holding_fails_with_a_message_after_the_wait(sandbox):
    # another running unit that wants it: systemd keeps it loaded (a dependency's reference) after
    # its stop, which the wait cannot free
    holder = f"{UNIT}-holder"
    start()
    sandbox_sh(f"systemd-run --quiet --collect --unit {holder} -p Wants={UNIT}.service -- sleep 300")
    try:
        r = sandbox_sh(f"sh -c {shlex.quote(name_released(UNIT + '.service', timeout=2))}", check=False)
        assert r.returncode == 1, (r.returncode, r.stderr)
        assert f"systemd still holds {UNIT}.service after 2 s" in r.stderr
        # it was stopped on the way (a stop is what lets systemd unload an ended transient unit)
        assert sandbox_sh(f"systemctl is-active {UNIT}", check=False).stdout.strip() == "inactive"
    finally:
        sandbox_sh(f"systemctl stop {holder} {UNIT}", check=False)
