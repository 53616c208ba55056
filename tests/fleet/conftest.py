"""The fleet sandbox for tests/fleet: `make fleet-up N=3` when it is not up (then removed after)."""

from __future__ import annotations

import json
import os
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
    """The fleet's ports are this checkout's (.sandbox/ports.json, or GLM_FLASH_SANDBOX_PORT when set)."""
    return dict(os.environ, GLM_FLASH_API_KEY=KEY, GLM_FLASH_WORKER_KEY=WORKER_KEY)


def boot(n: int) -> None:
    """Boot the fleet's machines that are not running, on the lower layer the fleet already has."""
    lower = ["--from-sandbox"] if (REPO / ".sandbox" / "fleet" / "from-sandbox").exists() else []
    subprocess.run([sys.executable, "sandbox/fleet.py", "up", "-n", str(n), *lower], cwd=REPO, env=env(), check=True)


def sandbox(*args: str) -> None:
    subprocess.run([sys.executable, "sandbox/sandbox.py", *args], cwd=REPO, env=env(), check=True)


# What puts things back after tests/fleet: the fleet down when this session booted it, the single
# sandbox up when it was powered off for the fleet. pytest would run a fixture's teardown only at the
# end of the session (tests/fleet is not a Python package, so "package" scope is the session's):
# too late for tests/host and tests/sandbox, which come after and check the single sandbox.
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


@pytest.fixture(scope="session")
def fleet_up(request) -> list[dict]:
    """The fleet's nodes (node1 the gateway, node2.. the workers) as sandbox/fleet.py wrote them.

    In `make test` (the single sandbox deployed by this session, no fleet up) the fleet boots on the
    deployed sandbox (FROM_SANDBOX), so the full fleet deploy runs too; the single sandbox is powered
    off meanwhile (it is the fleet's read-only lower layer) and booted again after tests/fleet."""
    if os.geteuid() != 0:
        pytest.skip("the fleet sandbox needs root (systemd-nspawn, overlay mounts)")
    nodes = REPO / ".sandbox" / "fleet" / "nodes.json"
    existing = len(json.loads(nodes.read_text())) if nodes.exists() else 0
    on_single = not existing and request.getfixturevalue("sandbox_deploys") is not None
    if not existing:
        _RESTORE.append(lambda: subprocess.run([sys.executable, "sandbox/fleet.py", "down"], cwd=REPO, env=env()))
    if on_single:
        sandbox("down")
        _RESTORE.append(lambda: sandbox("up"))  # tests/host and tests/sandbox check the single sandbox
        subprocess.run(
            [sys.executable, "sandbox/fleet.py", "up", "-n", str(N), "--from-sandbox"], cwd=REPO, env=env(), check=True
        )
    # Boots only the machines that are not running (a test may have powered one off).
    boot(max(N, existing))
    yield json.loads(nodes.read_text())
    restore()  # when the session ends inside tests/fleet (-x, an interrupt)
