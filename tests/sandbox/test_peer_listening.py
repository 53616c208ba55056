"""A fleet worker's peer server waited for until its socket listens (roles/fleet/artifacts.py
listening()), on Debian 13's real systemd and iproute2's ss. Seen in a cold CI run: the serve
operation returned once Python had started (`--service-type=exec`), and a receiver found the
worker's port closed for the 30 s it retries. The servers here are stand-ins (a Python socket
that binds late, or never) started as the deploy starts the real one, a transient unit; the
fleet tests (tests/fleet) run the real glm-flash-peer under it.
"""

from __future__ import annotations

import shlex

import pytest

from roles.fleet.artifacts import listening
from tests.conftest import sandbox_sh
from tests.sandbox.test_prometheus_scrape import port

pytestmark = pytest.mark.sandbox
UNIT = "glm-flash-test-peer-listening"


def started(program: str, timeout: int = 30) -> tuple[int, str]:
    """The stand-in server started as serving() starts glm-flash-peer, then listening(); its status
    and what it said, and whether its port listened when it returned."""
    script = (
        f"since=$(date +%s) && systemd-run -q --collect --service-type=exec --unit {UNIT} -- "
        f"python3 -c {shlex.quote(program)} && {listening(UNIT, '127.0.0.1', port('webhook'), timeout)}"
        f" && ss -Hltn src 127.0.0.1:{port('webhook')}"
    )
    r = sandbox_sh(f"sh -c {shlex.quote(script)}", check=False)
    return r.returncode, r.stdout + r.stderr


@pytest.fixture(autouse=True)
def stopped():
    sandbox_sh(f"systemctl stop {UNIT} 2>/dev/null; systemctl reset-failed {UNIT} 2>/dev/null; true")
    yield
    sandbox_sh(f"systemctl stop {UNIT} 2>/dev/null; systemctl reset-failed {UNIT} 2>/dev/null; true")


def test_a_server_that_binds_late_is_waited_for():
    # it binds 3 s after it started: a wait that returned at the start finds no socket in the ss after it
    rc, out = started(
        f"import socket, time; time.sleep(3); s = socket.socket(); s.bind(('127.0.0.1', {port('webhook')})); "
        "s.listen(); time.sleep(300)"
    )
    assert rc == 0, out
    assert f"127.0.0.1:{port('webhook')}" in out, f"returned before the server listened: {out!r}"


def test_a_server_that_ends_before_it_listens_fails_the_operation_with_its_log():
    rc, out = started("import sys, time; time.sleep(1); print('bind failed: stand-in', flush=True); sys.exit(3)")
    assert rc == 1, out
    assert f"glm-flash: the peer server {UNIT} ended before it listened on 127.0.0.1:{port('webhook')}" in out
    assert "bind failed: stand-in" in out, f"the server's own lines are not shown: {out!r}"


def test_a_server_that_never_listens_fails_the_operation_after_the_wait():
    rc, out = started("import time; time.sleep(300)", timeout=2)
    assert rc == 1, out
    assert f"does not listen on 127.0.0.1:{port('webhook')} after 2 s" in out, out
