"""The fleet's peer file server (roles/fleet/artifacts.py serving(), files/glm-flash-peer) on the
fleet sandbox: only the transfer's token and the receivers' addresses get a file, it runs as an
unprivileged dynamic user that holds nothing, and it goes away by itself (issue 22 item 2).

The server is started here with the very command the deploy runs (serving()), on node2 after a
transfer put the artifacts there; node3 plays the receiver, node4 a machine outside the transfer
and the fleet (a worker removed from the inventory; node1, the gateway's machine, has no python to
ask with). Simulated: a killed deploy is a server that nobody stops (the deploy
would stop it at the transfer's end); its idle time is 8 s here instead of the default 120 s
(fleet_peer_idle_s). The machines share the host's network (each its own loopback address), where
IPAddressAllow= may not be enforced (cgroup BPF in a container): the server's own 403 is what the
test sees then, and the test says which of the two refused.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import subprocess
import time

import pytest

from roles.fleet.artifacts import serving
from tests.conftest import REPO
from tests.fleet.conftest import boot
from tests.fleet.test_artifacts_fleet import DIR, ssh
from tests.fleet.test_fleet_membership import deploy

pytestmark = pytest.mark.sandbox
UNIT = "glm-flash-peer-serve-probe"
TOKEN_FILE = "/opt/glm-flash/fleet/tokens/probe.token"
IDLE_S = 8
SCORE = re.compile(r"Overall exposure level for \S+: (\d+\.\d+)")


def ask(node: str, src: str, url: str, token: str | None) -> str:
    """From `node`, bound to its address `src`: the HTTP status of a GET (or the connection's failure)."""
    code = (
        "import http.client, sys, urllib.parse\n"
        "u = urllib.parse.urlsplit(sys.argv[1])\n"
        "c = http.client.HTTPConnection(u.hostname, u.port, timeout=5, source_address=(sys.argv[2], 0))\n"
        "h = {'Authorization': 'Bearer ' + sys.stdin.read().strip()} if sys.argv[3] == 'y' else {}\n"
        "try:\n    c.request('GET', u.path, headers={**h, 'Range': 'bytes=0-9'}); print(c.getresponse().status)\n"
        "except OSError as e:\n    print('refused:', type(e).__name__)\n"
    )
    r = subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/fleet/ssh_config"), node, "python3", "-c", shlex.quote(code), url, src]
        + (["y"] if token else ["n"]),
        input=token or "",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def nodes(fleet_up):
    if len(fleet_up) < 4:
        boot(4)
    nodes = json.loads((REPO / ".sandbox/fleet/nodes.json").read_text())
    # node2..node4 hold the artifacts, glm-flash-peer and its manifest; then node4 leaves the fleet.
    for workers in (3, 2):
        rc, out = deploy(workers)
        assert rc == 0, out[-3000:]
    return nodes


def test_the_peer_server_serves_the_transfers_receivers_only_unprivileged_and_stops_by_itself(nodes):
    server, receiver, outside = nodes[1], nodes[2], nodes[3]
    token = secrets.token_urlsafe(32)
    ssh(server["name"], f"install -d -m 700 /opt/glm-flash/fleet/tokens && rm -f {TOKEN_FILE}")
    subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/fleet/ssh_config"), server["name"], f"umask 077; cat > {TOKEN_FILE}"],
        input=token,
        text=True,
        check=True,
    )
    (command,) = serving(
        UNIT,
        "/opt/glm-flash/bin/glm-flash-peer",
        "/opt/glm-flash",
        "/opt/glm-flash/fleet/artifacts.txt",
        server["address"],
        [receiver["address"]],
        TOKEN_FILE,
        idle=IDLE_S,
    )
    assert token not in command
    since = ssh(server["name"], "date +%s.%N").strip()
    ssh(server["name"], command)
    # systemd-run returns once the server is exec'd, not once it listens: wait for its own line
    # (printed after the bind), as the deploy's receivers retry a refused connection.
    listening = f"journalctl -u {UNIT} --since @{since} -o cat --no-pager | grep -q 'glm-flash-peer: serving'"
    deadline = time.monotonic() + 60
    while ssh(server["name"], f"{listening} && echo yes || true").strip() != "yes":
        assert time.monotonic() < deadline, "the peer server did not say it listens within 60 s"
        time.sleep(0.2)
    wheel = ssh(server["name"], f"ls {DIR} | head -n 1").strip()
    url = f"http://{server['address']}:30080/fleet-test/wheelhouse/{wheel}"
    try:
        # The receiver with the transfer's token gets the file; without it, or with another, 401.
        assert ask(receiver["name"], receiver["address"], url, token) == "206"
        assert ask(receiver["name"], receiver["address"], url, None) == "401"
        assert ask(receiver["name"], receiver["address"], url, secrets.token_urlsafe(32)) == "401"
        # A machine outside the transfer, even with the token: refused by the unit's IPAddressAllow=
        # (the connection) or by the server itself (403).
        outside_answer = ask(outside["name"], outside["address"], url, token)
        assert outside_answer == "403" or outside_answer.startswith("refused"), outside_answer
        print(f"outside the fleet: {outside_answer}")
        # Unprivileged: a dynamic user, no capabilities; rated by systemd-analyze.
        pid = ssh(server["name"], f"systemctl show -p MainPID --value {UNIT}").strip()
        user = ssh(server["name"], f"ps -o user= -p {pid}").strip()
        caps = ssh(server["name"], f"grep -E '^Cap(Eff|Prm|Bnd):' /proc/{pid}/status")
        assert user not in ("root", "0") and user, user
        assert all(line.split()[1] == "0000000000000000" for line in caps.splitlines()), caps
        score = SCORE.search(ssh(server["name"], f"systemd-analyze security --no-pager {UNIT} || true"))
        assert score and float(score.group(1)) <= 1.5, score and score.group(0)
        print(f"systemd-analyze security {UNIT}: {score.group(1)}")
        # The token: read from a credential, nowhere in argv or the journal. The root-only file stays
        # (0600 root) while this worker may still fetch with it; the fetch and the stop remove it
        # (roles/fleet/artifacts.py, tests/unit/test_fleet.py).
        assert ssh(server["name"], f"stat -c '%a %U' {TOKEN_FILE}").split() == ["600", "root"]
        assert token not in ssh(server["name"], "ps -eo args")
        assert token not in ssh(server["name"], f"journalctl -u {UNIT} -o cat --no-pager")
        # Nobody stops it (a killed deploy): gone within its idle time and a few seconds.
        last = time.monotonic()
        deadline = last + IDLE_S + 10
        while time.monotonic() < deadline:
            state = ssh(server["name"], f"systemctl is-active {UNIT} || true").strip()
            if state in ("inactive", "failed", "unknown"):
                break
            time.sleep(1)
        gone_after = time.monotonic() - last
        assert state in ("inactive", "unknown"), state
        assert gone_after <= IDLE_S + 10
        print(f"gone {gone_after:.1f} s after its last request (idle time {IDLE_S} s)")
    finally:
        ssh(server["name"], f"systemctl stop {UNIT} 2>/dev/null; rm -f {TOKEN_FILE}; true")
