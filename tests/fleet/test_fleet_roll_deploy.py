"""The rolling restart as a pyinfra run drives it: tests/fleet/roll_deploy.py defines the engine's
restart operation as roles/service.py does behind a gateway (started_from_disk with the run's
Roll, pyinfra's `_parallel=roll_batch`), run by pyinfra against the fleet sandbox's workers, in
front of which the real router (node1) serves a client loop.

Simulated: each worker's glm-flash.service is a stand-in engine (tests/bench/fake_openai.py under
the worker's own python3 and systemd, accepting only the worker key, ready once it answers: its
ExecStartPost waits for /health, as the real unit's readiness check waits for a completion), and
what changed on disk is a stamp file the unit "starts from". The deploy's other operations (the
environment, unit and flags a real upgrade changes) are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from unittest import mock

import pytest

from control.fleet import gateway_profile
from control.profile import build
from tests.conftest import REPO
from tests.fleet.conftest import KEY, WORKER_KEY, env, kept, ssh
from tests.fleet.test_fleet_roll import Clients
from tests.fleet.test_gateway_fleet import gateway_deploy, healthy, inventory, wait

pytestmark = pytest.mark.sandbox

RUN = """import sys, threading
sys.path.insert(0, "/opt/glm-flash-standin")
from fake_openai import FakeOpenAI
key = open("/etc/glm-flash-standin/key").read().strip()
FakeOpenAI(host=sys.argv[1], port=int(sys.argv[2]), api_key=key, tok_s=400, lifetime_s=3600).__enter__()
threading.Event().wait()
"""
READY = """import sys, time, urllib.request
for _ in range(300):
    try:
        urllib.request.urlopen(f"http://{sys.argv[1]}:{sys.argv[2]}/health", timeout=2).read()
        sys.exit(0)
    except OSError:
        time.sleep(0.2)
sys.exit(1)
"""


def put(node: str, path: str, text: str) -> None:
    run = ssh(node, f"mkdir -p $(dirname {path}) && cat > {path}", text)
    assert run.returncode == 0, run.stderr


def unit(host: str, port: int) -> str:
    return (
        "[Unit]\nDescription=stand-in engine (tests/fleet/test_fleet_roll_deploy.py)\n[Service]\n"
        f"ExecStart=/usr/bin/python3 /opt/glm-flash-standin/run.py {host} {port}\n"
        f"ExecStartPost=/usr/bin/python3 /opt/glm-flash-standin/ready.py {host} {port}\n"
        "KillMode=control-group\n"
    )


def roll_run() -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory/fleet_sandbox.py", "tests/fleet/roll_deploy.py"]
        + ["--limit", "workers"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def standins(fleet_up):
    inv = inventory()
    name, data = inv["gateway"][0]
    with mock.patch.dict(os.environ, {"GLM_FLASH_API_KEY": KEY, "GLM_FLASH_WORKER_KEY": WORKER_KEY}):
        gw = gateway_profile(name, data)
    run = gateway_deploy()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    by_address = {n["address"]: n["name"] for n in fleet_up}
    profiles = [build(wname, wdata, api_key_present=True) for wname, wdata in inv["workers"]]
    workers = [(p, by_address[p.fleet_own_address]) for p in profiles]
    nodes = [node for _, node in workers]
    # Put back after the module: on the fleet built from the deployed sandbox the unit is the deploy's.
    with kept(nodes, ["/etc/systemd/system/glm-flash.service", "/opt/glm-flash-standin", "/etc/glm-flash-standin"]):
        try:
            for p, node in workers:
                have = ssh(
                    node,
                    "python3 -c 'import shutil, concurrent.futures' 2>/dev/null || (apt-get update -q && apt-get install -y -q python3)",
                )
                assert have.returncode == 0, have.stderr[-2000:]
                put(node, "/opt/glm-flash-standin/fake_openai.py", (REPO / "tests/bench/fake_openai.py").read_text())
                put(node, "/opt/glm-flash-standin/run.py", RUN)
                put(node, "/opt/glm-flash-standin/ready.py", READY)
                put(node, "/etc/glm-flash-standin/key", WORKER_KEY + "\n")
                put(node, "/etc/systemd/system/glm-flash.service", unit(p.fleet_own_address, p.port))
                up = ssh(
                    node,
                    "touch /etc/glm-flash-standin/stamp && systemctl daemon-reload && systemctl restart glm-flash.service",
                )
                assert up.returncode == 0, up.stderr
            wait(lambda: len(healthy(gw)) == len(nodes) and all(healthy(gw).values()), 60)
            yield gw, nodes
        finally:
            for node in nodes:
                ssh(node, "systemctl stop glm-flash.service")


def test_a_pyinfra_run_rolls_the_workers_one_at_a_time_and_loses_nothing(standins):
    gw, nodes = standins
    for node in nodes:  # what changed on disk since each engine started
        assert ssh(node, "sleep 0.1; touch /etc/glm-flash-standin/stamp").returncode == 0
    with Clients(gw) as clients:
        time.sleep(1)
        run = roll_run()
        time.sleep(1)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    steps = re.findall(r"glm-flash roll: (\S+): (out of the gateway|back in the gateway)", out)
    print(f"{clients.sent} requests during the pyinfra roll: {len(clients.lost)} lost, {clients.retried} retried")
    print("\n".join(f"{h}: {s}" for h, s in steps))
    # Strictly one at a time: each worker out, then back, before the next is taken out.
    assert len(steps) == 2 * len(nodes), out[-4000:]
    for i in range(0, len(steps), 2):
        assert steps[i][1] == "out of the gateway" and steps[i + 1] == (steps[i][0], "back in the gateway"), steps
    assert len({h for h, _ in steps}) == len(nodes)
    assert clients.lost == [] and clients.retried == 0, clients.lost
    assert all(healthy(gw).values())
    # Converged: a second run restarts nothing and changes nothing.
    again = roll_run()
    out = again.stdout + again.stderr
    assert again.returncode == 0 and "glm-flash roll:" not in out, out[-3000:]
    totals = [line for line in out.splitlines() if "Grand total" in line][0].split()
    assert totals[-3:] == ["-", "-", totals[-4]], out[-2000:]


def started_at(node: str) -> str:
    return ssh(node, "systemctl show -p InactiveExitTimestampMonotonic --value glm-flash.service").stdout.strip()


def test_a_broken_worker_stops_the_pyinfra_roll_and_the_next_run_brings_it_back(standins):
    gw, nodes = standins
    for node in nodes:
        assert ssh(node, "sleep 0.1; touch /etc/glm-flash-standin/stamp").returncode == 0
    # Every worker's engine is broken on disk, still serving from before: pyinfra takes the hosts of
    # a `_parallel` batch in no fixed order (its active hosts are a set), so whichever the roll
    # takes first fails, and every other must then be left serving, not restarted.
    for node in nodes:
        put(node, "/opt/glm-flash-standin/run.py", "import sys\nsys.exit('a broken engine')\n")
    before = {n: started_at(n) for n in nodes}
    try:
        with Clients(gw) as clients:
            run = roll_run()
        out = run.stdout + run.stderr
        assert run.returncode != 0, out[-3000:]
        failed = re.findall(r"glm-flash roll: (\S+): its engine did not come back", out)
        assert len(failed) == 1, out[-3000:]
        first, rest = failed[0], [n for n in nodes if n != failed[0]]
        for node in rest:
            assert f"glm-flash roll: {node}: not restarted: the roll stopped at {first}" in out, out[-3000:]
            assert started_at(node) == before[node], f"{node}'s engine was restarted after the roll stopped"
        assert clients.lost == [], clients.lost
        listed = healthy(gw)
        assert all(listed[u] for u in listed) and len(listed) == len(rest)  # the broken one is out
        print(f"{clients.sent} requests while the pyinfra roll stopped at {first}: {len(clients.lost)} lost")
    finally:
        for node in nodes:
            put(node, "/opt/glm-flash-standin/run.py", RUN)
    # Fixed: the next run starts it (it was not serving), puts it back, and rolls the rest.
    again = roll_run()
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-3000:]
    wait(lambda: len(healthy(gw)) == len(nodes) and all(healthy(gw).values()), 30)
