"""The full fleet deploy (deploy_fleet.py: artifact step, then deploy.py) on every worker.

Needs the fleet booted on the deployed single sandbox (`make deploy`, `sandbox.py down`,
`make fleet-up FROM_SANDBOX=1`): an engine environment is about 11 GB, so each worker is an
overlay of the one deployed root, and this checks that the deploy converges on every worker and
that a second run changes nothing. Simulated as in the single sandbox: no GPU, the NVIDIA
repository a stand-in, the checkpoint staged.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.fleet.conftest import env

pytestmark = pytest.mark.sandbox


def deploy() -> tuple[int, str, list[str]]:
    run = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory/fleet_sandbox.py", "deploy_fleet.py", "--limit", "workers"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    out = run.stdout + run.stderr
    totals = [line for line in out.splitlines() if "Grand total" in line]
    return run.returncode, out, totals[0].split() if totals else []


def test_the_fleet_deploy_converges_on_every_worker_and_a_second_run_changes_nothing():
    if not (REPO / ".sandbox" / "fleet" / "from-sandbox").exists():
        pytest.skip("needs the fleet on the deployed single sandbox: make deploy; make fleet-up FROM_SANDBOX=1")
    rc, out, _ = deploy()
    assert rc == 0, out[-4000:]
    rc, out, totals = deploy()
    assert rc == 0, out[-4000:]
    assert totals[-3:] == ["-", "-", totals[-4]], out[-4000:]
