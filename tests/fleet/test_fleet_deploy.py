"""The full fleet deploy (deploy_fleet.py: artifact step, then deploy.py) on every worker.

Needs the fleet booted on the deployed single sandbox (in `make test` tests/fleet/conftest.py
does it after the single sandbox's deploy; by hand: `make deploy`, `sandbox.py down`,
`make fleet-up FROM_SANDBOX=1`): an engine environment is about 11 GB, so each worker is an
overlay of the one deployed root. This checks that the deploy converges on every worker, that a
second run changes nothing, and that a worker made unreachable mid-run leaves the others
converged and is named in the summary. Simulated as in the single sandbox: no GPU, the NVIDIA
repository and the hub stand-ins.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.fleet.conftest import boot, env

pytestmark = pytest.mark.sandbox


DEPLOY = [sys.executable, "-m", "pyinfra", "-y", "inventory/fleet_sandbox.py", "deploy_fleet.py", "--limit", "workers"]


def deploy() -> tuple[int, str, list[str]]:
    run = subprocess.run(DEPLOY, cwd=REPO, env=env(), capture_output=True, text=True, timeout=3600)
    out = run.stdout + run.stderr
    totals = [line for line in out.splitlines() if "Grand total" in line]
    return run.returncode, out, totals[0].split() if totals else []


def test_the_fleet_deploy_converges_on_every_worker_and_a_second_run_changes_nothing(fleet_up):
    if not (REPO / ".sandbox" / "fleet" / "from-sandbox").exists():
        pytest.skip("needs the fleet on the deployed single sandbox: make deploy; make fleet-up FROM_SANDBOX=1")
    rc, out, _ = deploy()
    assert rc == 0, out[-4000:]
    rc, out, totals = deploy()
    assert rc == 0, out[-4000:]
    assert totals[-3:] == ["-", "-", totals[-4]], out[-4000:]


def test_a_worker_unreachable_mid_run_leaves_the_others_converged_and_is_named(fleet_up):
    if not (REPO / ".sandbox" / "fleet" / "from-sandbox").exists():
        pytest.skip("needs the fleet on the deployed single sandbox: make deploy; make fleet-up FROM_SANDBOX=1")
    seed, gone = fleet_up[1]["name"], fleet_up[-1]["name"]
    proc = subprocess.Popen(DEPLOY, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, started = [], 0
    for line in proc.stdout:
        lines.append(line)
        started += "Starting operation:" in line
        if started == 5:  # mid-run: connected and planned, some operations done
            subprocess.run(["ssh", "-F", str(REPO / ".sandbox/fleet/ssh_config"), gone, "systemctl poweroff"])
    out = "".join(lines)
    assert proc.wait(timeout=3600) != 0, out[-3000:]
    summary = out[out.rindex("--> Summary") :]
    assert f"[{gone}] unreachable: SSH to" in summary, summary
    assert f"[{seed}] deployed" in summary, summary
    boot(len(fleet_up))
    rc, out, _ = deploy()  # back: it converges
    assert rc == 0, out[-4000:]
