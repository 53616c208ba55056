"""Readiness on the deployed unit: asked where the engine listens, and only a real answer counts.

The deploy runs with `listen_host` set to one address (one 127.A.B.250 address of this checkout's, as a fleet worker sets its
private address) and an API key (a non-loopback address needs one). A drop-in under /run then
swaps only the engine for a stand-in (no GPU here: simulated is the engine, an OpenAI-shaped
server bound to that one address that checks the key from its credential); the unit's own
ExecStartPost, rendered by the deploy, decides whether the start succeeds. Then the stand-in
answers an empty message, then greedy requests only (a sampled one gets sglang's error without
ninja): each start fails and the journal says why. Afterwards the drop-in
goes and the inventory's own values are deployed again (converged: nothing left changed).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, SANDBOX_INVENTORY, changed_operations, journal_end, run_log, sandbox_sh
from tests.sandbox.test_unit_hardening import put

pytestmark = pytest.mark.sandbox
# One address of this checkout's own loopback /24 (sandbox/fleet.py), so two checkouts never meet.
ADDRESS = (
    subprocess.run(  # fleet.py imports its sibling as `sandbox`, so it is asked in a process of its own
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'sandbox'); import fleet; print(fleet.subnet())"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.strip()
    + ".250"
)  # fmt: skip
KEY = "sk-ready-test-8c1f"
UNIT = "glm-flash.service"
DROPIN = "/run/systemd/system/glm-flash.service.d/test-ready.conf"
ENGINE = "/run/glm-flash-test-engine.py"
STANDIN = """
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, HTTPServer
address, port, content, load_s = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
sampled_fails = sys.argv[5:] == ["sampled-fails"]
for i in range(1, load_s + 1):  # a first start's load: lines in the journal, nothing listening yet
    print(f"stand-in engine: loading weights {i}/{load_s}", flush=True)
    time.sleep(1)
key = open(os.path.join(os.environ["CREDENTIALS_DIRECTORY"], "api-key")).read().strip()
class Engine(BaseHTTPRequestHandler):
    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.headers.get("Authorization") != "Bearer " + key:
            self.send_response(401); self.end_headers(); return
        if sampled_fails and request.get("temperature", 1.0) > 0:  # as sglang without ninja: argmax only
            body = json.dumps({"object": "error", "message": "FileNotFoundError: No such file or directory: 'ninja'"}).encode()
            self.send_response(500); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body); return
        body = json.dumps({"choices": [{"message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
HTTPServer((address, port), Engine).serve_forever()
"""


def deploy(*data: str, key: str | None = None) -> list[str]:
    args = [sys.executable, "-m", "pyinfra", "-y", "--json"]
    for d in data:
        args += ["--data", d]
    env = {k: v for k, v in os.environ.items() if k != "GLM_FLASH_API_KEY"}
    if key:
        env["GLM_FLASH_API_KEY"] = key  # the control machine's environment, as a user exports it
    run = subprocess.run(
        [*args, SANDBOX_INVENTORY, "deploy.py"], cwd=REPO, capture_output=True, text=True, env=env, timeout=3600
    )
    assert run.returncode == 0, run.stderr[-6000:]
    return changed_operations(run.stdout)


def engine_standin(content: str, port: int, load_s: int = 0, sampled_fails: bool = False, start_s: int = 40) -> None:
    """The drop-in: the unit's engine is the stand-in (answers `content` after `load_s` s; with
    `sampled_fails`, greedy requests only), stopped; systemd gives its start `start_s` s."""
    put(ENGINE, STANDIN)
    sandbox_sh(f"chmod 0644 {ENGINE}")
    put(
        DROPIN,
        "[Service]\nExecStartPre=\n"
        f"ExecStart=\nExecStart=/usr/bin/python3 {ENGINE} {ADDRESS} {port} {json.dumps(content)} {load_s}"
        + (" sampled-fails\n" if sampled_fails else "\n")
        + f"TimeoutStartSec={start_s}\nRestart=no\n",
    )
    sandbox_sh(f"systemctl daemon-reload; systemctl stop {UNIT}; systemctl reset-failed {UNIT}", check=False)


def start_with_engine(content: str, port: int, sampled_fails: bool = False, start_s: int = 40) -> tuple[int, str]:
    engine_standin(content, port, sampled_fails=sampled_fails, start_s=start_s)
    cursor = journal_end()
    start = sandbox_sh(f"timeout 90 systemctl start {UNIT}", check=False)
    inv = sandbox_sh(f"systemctl show -p InvocationID --value {UNIT}").stdout.strip()
    return start.returncode, run_log(UNIT, inv, cursor)


@pytest.fixture(scope="module")
def one_address(sandbox):
    deploy(f"listen_host={ADDRESS}", key=KEY)
    unit = sandbox_sh(f"systemctl cat {UNIT}").stdout
    port = int(json.loads(sandbox_sh("cat /etc/glm-flash/status.json").stdout)["port"])
    assert f"glm-flash-ready --host {ADDRESS} --port {port} " in unit, unit
    try:
        yield port
    finally:
        sandbox_sh(
            f"systemctl stop {UNIT}; rm -f {DROPIN} {ENGINE}; systemctl daemon-reload; systemctl reset-failed {UNIT}",
            check=False,
        )
        deploy()
        assert deploy() == [], "the inventory's own values converge again"
        sandbox_sh(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}", check=False)


def test_an_engine_on_one_address_becomes_active_and_ready(one_address):
    rc, log = start_with_engine("OK", one_address)
    assert rc == 0, log
    assert sandbox_sh(f"systemctl is-active {UNIT}", check=False).stdout.strip() == "active"
    assert "glm-flash: ready after" in log and "answered" in log, log
    # it listens on that address only: loopback's usual address has nothing
    assert sandbox_sh(f"ss -Htln 'sport = :{one_address}'").stdout.count(ADDRESS) == 1
    assert "127.0.0.1:" not in sandbox_sh(f"ss -Htln 'sport = :{one_address}'").stdout


def test_an_empty_answer_is_not_ready_and_the_journal_says_why(one_address):
    rc, log = start_with_engine("", one_address, start_s=15)  # never ready: the start runs out its time
    assert rc != 0, log
    assert sandbox_sh(f"systemctl is-active {UNIT}", check=False).stdout.strip() != "active"
    assert "answered with an empty message" in log, log


def test_an_engine_that_fails_sampled_requests_is_not_ready_and_the_journal_says_why(one_address):
    """#35: sglang without ninja answers temperature 0 (argmax) and fails the first sampled request;
    the unit's readiness sends one of each, so the start fails at once, naming the cause."""
    rc, log = start_with_engine("OK", one_address, sampled_fails=True)
    assert rc != 0, log
    assert sandbox_sh(f"systemctl is-active {UNIT}", check=False).stdout.strip() != "active"
    assert "answered a greedy request but a sampled one (temperature 0.7, top_p 0.9) failed" in log, log
    assert "No such file or directory: 'ninja'" in log, log


def test_the_deploy_shows_the_engine_and_the_elapsed_time_while_readiness_waits(one_address):
    """#21.4: a first start on a GPU host blocks the deploy until readiness passes (up to
    startup_timeout_s); meanwhile the deploy's output shows the engine's journal lines and how
    long readiness has waited. Simulated: the engine (the stand-in, loading for 12 s before it
    listens) and the GPU: the sandbox has none, so deploy.py takes the no-GPU branch of this
    operation; tests/sandbox/start_deploy.py runs the same operation with can_serve=True alone."""
    engine_standin("OK", one_address, load_s=12)
    run = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", SANDBOX_INVENTORY, "tests/sandbox/start_deploy.py"],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert sandbox_sh(f"systemctl is-active {UNIT}", check=False).stdout.strip() == "active"
    lines = out.splitlines()
    loading = [i for i, line in enumerate(lines) if "stand-in engine: loading weights" in line]
    waiting = [i for i, line in enumerate(lines) if re.search(r"glm-flash: not ready after \d+ s of \d+ s: ", line)]
    ready = [i for i, line in enumerate(lines) if re.search(r"glm-flash: ready after (\d+) s", line)]
    # 12 lines; the first ones may pass before the deploy's journalctl follows on a loaded machine
    assert len(loading) >= 6 and waiting and ready, out[-4000:]
    # the wait, as it happened: the engine loading and readiness refused, then the answer
    assert max(loading) < ready[0] and waiting[0] < ready[0], out[-4000:]
    assert int(re.search(r"glm-flash: ready after (\d+) s", lines[ready[0]]).group(1)) >= 10, lines[ready[0]]
