"""Growing, shrinking and replacing a deployed fleet's workers (issue 22 items 1 and 3), on the
fleet sandbox with the transfer steps only (tests/fleet/deploy_artifacts.py: the gateway's 25
wheels as the artifacts, the stand-in checkpoint from the stand-in hub).

Needs three workers: node1 (the gateway's machine, idle here) and node2..node4; the test boots
node4 when the fleet has fewer machines. The inventory takes its first GLM_FLASH_FLEET_WORKERS
machines after node1 as the workers, so "adding a worker" is running again with one more.
Simulated: the machines are containers on one kernel sharing the host's network (each its own
loopback address), the hub is sandbox/fake_hub.py (it logs every request), the wheels stand in for
the engine's 5 GB of artifacts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.fleet.conftest import boot, env, shown
from tests.fleet.test_artifacts_fleet import CHECKPOINT, DIR, checkpoint, hub_requests, manifest, ssh, sums

pytestmark = pytest.mark.sandbox
SERVE = "glm-flash-peer-serve"


def deploy(workers: int, *extra: str) -> tuple[int, str]:
    r = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory/fleet_sandbox.py", "tests/fleet/deploy_artifacts.py"]
        + ["--limit", "workers", *extra],
        cwd=REPO,
        env=dict(env(), GLM_FLASH_FLEET_WORKERS=str(workers)),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return r.returncode, r.stdout + r.stderr


def changes(out: str) -> list[str]:
    """pyinfra's Grand total line: [operations, changed, ..., errors]: '-' where nothing."""
    return [line for line in out.splitlines() if "Grand total" in line][0].split()


def sent(node: str, unit: str, since: str) -> int:
    """What the node's server of `unit` sent in this run (its last `sent N bytes` line; each run's
    server has a unit name of its own, glm-flash-peer-serve-<set>-<run's tag>)."""
    line = ssh(
        node,
        f"journalctl -u '{SERVE}-{unit}-*' --since @{since} -o cat --no-pager | grep -F 'sent ' | tail -n 1 || true",
    )
    return int(line.split()[2]) if line.startswith("glm-flash-peer: sent") else 0


def left_over(node: str) -> str:
    """Servers still running and tokens still on disk (none after a transfer)."""
    units = ssh(node, f"systemctl list-units --no-legend --plain '{SERVE}-*' | grep -F running || true")
    tokens = ssh(node, "ls -A /opt/glm-flash/fleet/tokens 2>/dev/null || true")
    return units.strip() + tokens.strip()


# The one hub request a transfer makes: the control machine's, for the hub's file list at the
# locked commit, which the seed's marker is held against (control/model_lock.py checked_by_hub).
# Nothing of the checkpoint comes from the hub, and no worker asks it anything.
FILE_LIST = "the control machine's file list of the locked commit"


def hub_asked(since: int) -> list[str]:
    """The hub's requests since the `since`-th; the locked commit's file list as FILE_LIST."""
    hub = json.loads((REPO / ".sandbox/hub/hub.json").read_text())  # what inventory/fleet_sandbox.py locks
    file_list = f"GET /api/models/{hub['repo']}/revision/{hub['commit']}?blobs=true"
    asked = [f"{r['method']} {r['path']}" for r in hub_requests()[since:]]
    return [FILE_LIST if line == file_list else line for line in asked]


@pytest.fixture(scope="module")
def three(fleet_up):
    """node2..node4, the fleet sandbox grown to four machines when it has fewer."""
    if len(fleet_up) < 4:
        boot(4)
    nodes = json.loads((REPO / ".sandbox/fleet/nodes.json").read_text())
    assert len(nodes) >= 4, "could not boot a fourth machine"
    return [n["name"] for n in nodes[1:4]]


def test_a_worker_added_removed_and_replaced_converges_from_the_fleet(three):
    a, b, c = three
    for node in three:
        ssh(node, f"rm -rf {DIR} {CHECKPOINT}")
    # Two workers deployed.
    rc, out = deploy(2)
    assert rc == 0, shown(out)
    wheels = manifest(a)
    assert sums(a) == sums(b) == wheels and len(wheels) == 25
    assert not left_over(a) and not left_over(b)

    # A third added: it gets everything from the two others; nothing from the control machine, nothing
    # of the checkpoint from the hub (the control machine asks it for the file list only).
    hub_before = len(hub_requests())
    since = ssh(a, "date +%s").strip()
    rc, out = deploy(3)
    assert rc == 0, shown(out)
    assert "From the control machine:" not in out, "the control machine sent a file the fleet holds"
    assert hub_asked(hub_before) == [FILE_LIST], "the hub was asked for more than its file list"
    assert sums(c) == wheels
    got, have = checkpoint(c), checkpoint(a)
    assert got["files"] == have["files"] and got["check"]["state"] == "complete" and got["check"]["sealed"]
    # The two others served it between them, each a part (aria2 takes pieces from both), and changed nothing.
    size = int(ssh(c, f"du -sb {DIR} | cut -f1"))
    by = {n: sent(n, "artifacts", since) for n in (a, b)}
    assert all(0 < s < size for s in by.values()) and sum(by.values()) >= size, (by, size)
    # The others' files are what they were (their servers' start and stop are their only operations).
    assert sums(a) == sums(b) == wheels and checkpoint(b)["files"] == have["files"] == checkpoint(a)["files"]
    assert not any(left_over(n) for n in three), "a server or a token outlived the transfer"
    # Converged: a second run moves nothing and changes nothing.
    rc, out = deploy(3)
    assert rc == 0 and "Serve the" not in out and changes(out)[-3:] == ["-", "-", changes(out)[-4]], out[-2000:]

    # One removed from the inventory: the others change nothing.
    rc, out = deploy(2)
    assert rc == 0 and "Serve the" not in out and changes(out)[-3:] == ["-", "-", changes(out)[-4]], out[-2000:]

    # One replaced (its machine wiped, back under the same name): it converges from the two others.
    ssh(b, f"rm -rf {DIR} {CHECKPOINT} /opt/glm-flash/fleet")
    hub_before = len(hub_requests())
    rc, out = deploy(3)
    assert rc == 0, shown(out)
    assert "From the control machine:" not in out and hub_asked(hub_before) == [FILE_LIST]
    assert sums(b) == wheels and checkpoint(b)["files"] == checkpoint(a)["files"]
    assert not any(left_over(n) for n in three)


def test_three_fresh_workers_no_source_sends_more_than_two_copies(three):
    for node in three:
        ssh(node, f"rm -rf {DIR} {CHECKPOINT}")
    since = ssh(three[0], "date +%s").strip()
    rc, out = deploy(3)
    assert rc == 0, shown(out)
    size = int(ssh(three[0], f"du -sb {DIR} | cut -f1"))
    found = ssh(
        three[0], f"find {CHECKPOINT} -type f ! -path '*/.cache/*' ! -name .glm-flash-model.json -printf '%s\\n'"
    )
    ckpt = sum(int(n) for n in found.split())
    for node in three:
        assert sums(node) == manifest(node)
        assert sent(node, "artifacts", since) <= 2 * size * 1.05, node
        assert sent(node, "glm-flash-model-download", since) <= 2 * ckpt * 1.05 + (1 << 20), node
