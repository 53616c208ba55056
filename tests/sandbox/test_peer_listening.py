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


def test_another_process_on_the_address_is_not_taken_for_the_server():
    # A socket that is not the unit's (here a second unit's, as a server of an earlier run that outlived
    # its stop would be) holds the address: the server cannot bind and ends. A wait that counted any
    # listener returned 0 here, and the receivers then met that other socket, or none once it closed.
    squatter = f"{UNIT}-squatter"
    sandbox_sh(
        f"systemd-run -q --collect --service-type=exec --unit {squatter} -- python3 -c "
        + shlex.quote(
            f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port('webhook')})); s.listen(); "
            "time.sleep(300)"
        )
        + f" && until ss -Hltn src 127.0.0.1:{port('webhook')} | grep -q .; do sleep 0.2; done"
    )
    try:
        rc, out = started(
            f"import socket; s = socket.socket(); s.bind(('127.0.0.1', {port('webhook')})); s.listen(); "
            "import time; time.sleep(300)"
        )
    finally:
        sandbox_sh(f"systemctl stop {squatter} 2>/dev/null; true")
    assert rc == 1, f"a listener that is not the unit's was taken for the server: {out!r}"
    assert f"glm-flash: the peer server {UNIT} ended before it listened on 127.0.0.1:{port('webhook')}" in out, out
    assert "Address already in use" in out, f"the server's own lines are not shown: {out!r}"
