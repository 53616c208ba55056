"""The full fleet deploy (deploy_fleet.py: artifact step, then deploy.py) on every worker.

Needs the fleet booted on a snapshot of the deployed single sandbox (in `make test` the session's
build keeps it and tests/fleet/conftest.py boots on it; by hand: `make deploy`,
`python3 sandbox/sandbox.py snapshot`, `make fleet-up FROM_SANDBOX=1`): an engine environment is
about 11 GB, so each worker is an overlay of the one deployed root. This checks that the deploy converges on every worker, that a
second run changes nothing, and that a worker made unreachable mid-run leaves the others
converged and is named in the summary. Simulated as in the single sandbox: no GPU, the NVIDIA
repository and the hub stand-ins.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import REPO
from tests.fleet.conftest import boot, env, shown

pytestmark = pytest.mark.sandbox


DEPLOY = [sys.executable, "-m", "pyinfra", "-y", "inventory/fleet_sandbox.py", "deploy_fleet.py", "--limit", "workers"]


def deploy() -> tuple[int, str, list[str]]:
    run = subprocess.run(DEPLOY, cwd=REPO, env=env(), capture_output=True, text=True, timeout=3600)
    out = run.stdout + run.stderr
    totals = [line for line in out.splitlines() if "Grand total" in line]
    return run.returncode, out, totals[0].split() if totals else []


def power_off_during(proc: subprocess.Popen, node: str) -> None:
    """Power `node` off while the run `proc` is held (SIGSTOP) and let it go on once the node no
    longer answers: a converged run takes seconds, a container's shutdown about as long."""
    ssh = ["ssh", "-F", str(REPO / ".sandbox/fleet/ssh_config"), "-o", "ConnectTimeout=2", node]
    proc.send_signal(signal.SIGSTOP)
    try:
        subprocess.run([*ssh, "systemctl poweroff"])
        for _ in range(60):
            if subprocess.run([*ssh, "true"], capture_output=True).returncode != 0:
                break
            time.sleep(1)
        else:
            raise AssertionError(f"{node} still answers a minute after its poweroff")
    finally:
        proc.send_signal(signal.SIGCONT)


@pytest.fixture
def deployed_fleet(fleet_up):
    """In `make test` the fleet always stands on the deployed sandbox (tests/fleet/conftest.py); a
    fleet someone booted by hand on the bare image would build an engine on every worker."""
    if not (REPO / ".sandbox" / "fleet" / "from-sandbox").exists():
        pytest.skip(
            "needs the fleet on the deployed single sandbox's snapshot: make deploy; "
            "python3 sandbox/sandbox.py snapshot; make fleet-up FROM_SANDBOX=1"
        )
    return fleet_up


def summary_of_a_run_losing(node: str, when) -> str:
    """A fleet deploy during which `node` is powered off once `when(lines so far)` holds: it must
    fail without an internal exception; its summary."""
    proc = subprocess.Popen(DEPLOY, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, powered_off = [], False
    for line in proc.stdout:
        lines.append(line)
        if not powered_off and when(lines):
            powered_off = True
            power_off_during(proc, node)
    out = "".join(lines)
    assert proc.wait(timeout=3600) != 0, out[-3000:]
    assert "An internal exception occurred" not in out, out[-6000:]
    return out[out.rindex("--> Summary") :]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_the_fleets_stand_ins_are_its_own_and_the_snapshots(deployed_fleet):
    """The single sandbox's tests run beside the fleet's and change its stand-in NVIDIA repository
    (a re-signed index, a new branch: tests/sandbox/test_nvidia_sources.py): the fleet installs
    from its own, serving the snapshot's files, on the fleet's own address; so is its hub."""
    standins = json.loads((REPO / ".sandbox/fleet/standins.json").read_text())
    subnet = deployed_fleet[0]["address"].rsplit(".", 1)[0]
    assert all(url.startswith(f"http://{subnet}.1:") for url in standins.values()), standins
    single = json.loads((REPO / ".sandbox/ports.json").read_text())["standin"]
    probe = REPO / ".sandbox/rootfs/srv/glm-flash-standin/fleet-isolation-probe"
    probe.write_text("written on the single sandbox after the snapshot\n")
    try:
        assert status(f"http://127.0.0.1:{single}/{probe.name}") == 200
        assert status(f"{standins['nvidia']}/{probe.name}") == 404
        assert status(f"{standins['nvidia']}/standin.json") == 200
    finally:
        probe.unlink()


def test_the_fleet_deploy_converges_on_every_worker_and_a_second_run_changes_nothing(deployed_fleet):
    rc, out, _ = deploy()
    assert rc == 0, shown(out)
    rc, out, totals = deploy()
    assert rc == 0, shown(out)
    assert totals[-3:] == ["-", "-", totals[-4]], shown(out)


def test_a_worker_unreachable_mid_run_leaves_the_others_converged_and_is_named(deployed_fleet):
    seed, gone = deployed_fleet[1]["name"], deployed_fleet[-1]["name"]
    # mid-run: connected and planned, some operations done
    summary = summary_of_a_run_losing(gone, lambda lines: sum("Starting operation:" in li for li in lines) == 5)
    assert f"[{gone}] unreachable: SSH to" in summary, summary
    assert f"[{seed}] deployed" in summary, summary
    # The same run again while it is still down: nothing left to do on the others, it is named again.
    rc, out, totals = deploy()
    assert rc != 0, shown(out)
    assert totals[-3:] == ["-", "-", totals[-4]], shown(out)
    summary = out[out.rindex("--> Summary") :]
    assert f"[{seed}] deployed" in summary and f"[{gone}] unreachable: SSH to" in summary, summary
    boot(len(deployed_fleet))
    rc, out, _ = deploy()  # back: it converges
    assert rc == 0, shown(out)


def test_a_seed_gone_before_it_sent_what_a_worker_lacks_is_named_in_that_workers_summary(deployed_fleet):
    seed, peer = deployed_fleet[1]["name"], deployed_fleet[-1]["name"]
    ssh = ["ssh", "-F", str(REPO / ".sandbox/fleet/ssh_config")]
    # One wheel the peer lacks: the seed is to send it (roles/fleet/artifacts.py). Taken from the
    # fleet's manifest (what this run's lock needs), not from the wheelhouse, which may also hold
    # the wheels of another engine set that no run of this lock sends.
    manifest = subprocess.run(
        [*ssh, peer, "cat /opt/glm-flash/fleet/artifacts.txt"], capture_output=True, text=True, check=True
    ).stdout
    rel = next(line.split()[3] for line in manifest.splitlines() if "/wheelhouse/" in line)
    subprocess.run([*ssh, peer, f"rm /opt/glm-flash/{rel}"], check=True)
    # planned: the peer is to receive from the seed
    summary = summary_of_a_run_losing(seed, lambda lines: "Beginning operation run" in lines[-1])
    assert f"[{seed}] unreachable: SSH to" in summary, summary
    assert (
        f"[{peer}] failed: it was to receive files from the fleet's seed {seed}, which became unreachable" in summary
    ), summary
    boot(len(deployed_fleet))
    rc, out, _ = deploy()  # the seed back: the peer receives what it lacks
    assert rc == 0, shown(out)
    rc, out, totals = deploy()
    assert rc == 0 and totals[-3:] == ["-", "-", totals[-4]], shown(out)
