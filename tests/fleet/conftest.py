"""The fleet sandbox for tests/fleet: `make fleet-up N=3` when it is not up (then removed after)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

KEY = "fleet-test-key"
# The gateway-to-worker key: the workers accept only it (the gateway holds both).
WORKER_KEY = "fleet-worker-key-0123456789"
N = 3


def env() -> dict:
    """The fleet's ports are this checkout's (.sandbox/ports.json, or GLM_FLASH_SANDBOX_PORT when set).
    The inventory's workers are node2..node<N> even when a test booted more machines (the
    membership and peer-server tests boot node4 and name their own worker count)."""
    return dict(
        os.environ,
        GLM_FLASH_API_KEY=KEY,
        GLM_FLASH_WORKER_KEY=WORKER_KEY,
        GLM_FLASH_FLEET_WORKERS=str(N - 1),
        GLM_FLASH_FLEET_CA=str(CA_DIR),
    )


BACKUP = "/root/.glm-flash-fleet-test-backup.tar"
# The fleet's authority for these tests (control/fleet_ca.py), this checkout's own: the gateway's
# certificate comes from it, and the tests' clients trust it alone.
CA_DIR = REPO / ".sandbox" / "fleet-ca"


@contextlib.contextmanager
def kept(nodes: list[str], paths: list[str]):
    """`paths` on each node put back as they were after the block (a test that writes stand-ins over
    what a deploy put there, e.g. on the fleet built from the deployed sandbox, which later tests
    deploy again): saved with tar, then removed and restored; paths that did not exist are removed."""
    listed = " ".join(shlex.quote(p) for p in paths)
    for node in nodes:
        run = ssh(
            node,
            f"rm -f {BACKUP}; cd / && tar -cpf {BACKUP} --ignore-failed-read {listed} 2>/dev/null; test -f {BACKUP}",
        )
        assert run.returncode == 0, run.stderr
    try:
        yield
    finally:
        for node in nodes:
            ssh(node, f"rm -rf {listed}; cd / && tar -xpf {BACKUP}; rm -f {BACKUP}; systemctl daemon-reload")


def shown(out: str) -> str:
    """A failed run's output for the assertion: every line of it that says error or failed (a
    host's error may come long before the tail, behind another host's output), then its tail."""
    flagged = [line for line in out.splitlines() if "rror" in line or "failed" in line.lower()]
    return (
        "lines with an error:\n"
        + "\n".join(flagged)[-4000:]
        + "\n\nthe output's end:\n"
        + out[-5000:]
        + "\n\nthe peer servers' last lines:\n"
        + servers_logs()
    )


def servers_logs() -> str:
    """Each running machine's peer servers (glm-flash-peer serve, the deploy's transient units), their
    journal's last lines with times: a receiver's "connection refused" says nothing of why a server
    was gone. Asked only when an assertion fails."""
    nodes = REPO / ".sandbox" / "fleet" / "nodes.json"
    out = []
    for node in json.loads(nodes.read_text()) if nodes.exists() else []:
        r = ssh(
            node["name"],
            "journalctl -u 'glm-flash-peer-serve-*' -o short-precise --no-pager -n 15 2>&1 | cut -c1-300",
        )
        out.append(f"[{node['name']}]\n{r.stdout}{r.stderr}")
    return "\n".join(out)


def ssh(node: str, command: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """`command` on a fleet machine by its name (node2), as root, with `stdin`; not checked."""
    return subprocess.run(
        ["ssh", "-F", ".sandbox/fleet/ssh_config", node, command],
        cwd=REPO,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )


def boot(n: int) -> None:
    """Boot the fleet's machines that are not running, on the lower layer the fleet already has
    (at least `n`, and every machine it has: a test that booted node4 keeps it)."""
    nodes = REPO / ".sandbox" / "fleet" / "nodes.json"
    n = max(n, len(json.loads(nodes.read_text())) if nodes.exists() else 0)
    lower = ["--from-sandbox"] if (REPO / ".sandbox" / "fleet" / "from-sandbox").exists() else []
    subprocess.run([sys.executable, "sandbox/fleet.py", "up", "-n", str(n), *lower], cwd=REPO, env=env(), check=True)


# What puts things back after tests/fleet: the fleet down when this session booted it. pytest would
# run a fixture's teardown only at the end of the session (tests/fleet is not a Python package, so
# "package" scope is the session's): too late for a session that runs other tests after them.
_RESTORE: list = []


def restore() -> None:
    while _RESTORE:
        _RESTORE.pop(0)()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of tests/fleet (this hook runs for its tests only) and its teardown."""
    try:
        return (yield)
    finally:
        if nextitem is None or Path(__file__).parent not in Path(nextitem.path).parents:
            restore()


SNAPSHOT = REPO / ".sandbox" / "rootfs.lower"  # sandbox/sandbox.py snapshot


@pytest.fixture(scope="session")
def fleet_up(request) -> list[dict]:
    """The fleet's nodes (node1 the gateway, node2.. the workers) as sandbox/fleet.py wrote them.

    On a snapshot of the deployed single sandbox (`make test` keeps one once its sandbox is deployed:
    the session's build, or this one's when tests/fleet run alone) the fleet boots on it
    (FROM_SANDBOX), so the full fleet deploy runs too, while the single sandbox runs on beside it;
    with none, on the bare image (the gateway's tests)."""
    if os.geteuid() != 0:
        pytest.skip("the fleet sandbox needs root (systemd-nspawn, overlay mounts)")
    nodes = REPO / ".sandbox" / "fleet" / "nodes.json"
    existing = len(json.loads(nodes.read_text())) if nodes.exists() else 0
    request.getfixturevalue("sandbox_deploys")  # this session's build (and its snapshot), when it has one
    if not existing:
        _RESTORE.append(lambda: subprocess.run([sys.executable, "sandbox/fleet.py", "down"], cwd=REPO, env=env()))
        lower = ["--from-sandbox"] if SNAPSHOT.exists() else []
        subprocess.run(
            [sys.executable, "sandbox/fleet.py", "up", "-n", str(N), *lower], cwd=REPO, env=env(), check=True
        )
    # Boots only the machines that are not running (a test may have powered one off).
    boot(max(N, existing))
    yield json.loads(nodes.read_text())
    restore()  # when the session ends inside tests/fleet (-x, an interrupt)
