"""Watching the deployed sandbox (roles/watch.py, issue 25): a real Prometheus scrapes it, and a
failed unit is told once, its webhook secret nowhere it should not be.

- Prometheus: Debian's `prometheus` package, installed for this test only (its own service masked
  before the install, so it never listens on 0.0.0.0:9090; purged after, with what it pulled in),
  run as a transient unit on loopback with the scrape config scripts/scrape_config.py writes from
  inventory/sandbox.py (interval shortened). Simulated: the engine. The sandbox has no GPU, so a
  stand-in serves the engine's port: the installed sglang-kt's own metric collectors
  (sglang.srt.observability.metrics_collector, from the engine environment), fed one request's
  numbers, exported with prometheus_client on 127.0.0.1:<port> (one module it imports, which loads
  CUDA kernels, is stubbed: see STAND_IN). The host and GPU metrics are the
  real node-exporter's and the real collector's (n/a: no GPU).
- Word on failure: the notifier's part of the deploy (tests/sandbox/notify_deploy.py, the same
  roles/watch.py code) runs with a canary webhook URL in GLM_FLASH_NOTIFY_WEBHOOK; a listener on
  loopback in the sandbox takes its POSTs, a command stand-in (the inventory's notify_command,
  written into notify.json here) records what it is told. A transient unit that fails 3 times
  (Restart=on-failure, then its start limit) runs the notifier on each failure; word goes once.
  Simulated: the failing unit and the receivers. Everything is put back in `finally`.
"""

from __future__ import annotations

import hashlib
import json
import os
import runpy
import secrets
import shlex
import time

import pytest

from sandbox.sandbox import current_ports
from scripts import scrape_config
from tests.conftest import REPO, SANDBOX_INVENTORY, pyinfra, sandbox_sh
from tests.unit.test_observability import DOCUMENTED, SCRAPED_IN_SANDBOX

pytestmark = pytest.mark.sandbox
TEST_DIR = "/run/glm-flash-test-watch"
PY = "/opt/glm-flash/engine/current/bin/python"  # install_root of inventory/sandbox.py


def port(name: str) -> int:
    """This checkout's own port for `name` (sandbox/sandbox.py chose it; the machine shares this one's
    network). Read when a test runs: at collection the session sandbox may still be booting in the
    background (tests/conftest.py), with no ports recorded yet (CI once asked port 0)."""
    found = current_ports()[name]
    assert found, f"the sandbox has no {name} port yet (.sandbox/ports.json)"
    return found


# Minted for this run: only a file written during the test can hold it, so the scan for it reads
# those files (canary_holders), not the whole machine.
CANARY = f"c4n4ry-w3bh00k-{secrets.token_hex(6)}"
MARKER = "/run/glm-flash-test-canary-since"  # made before the canary reaches the machine
SCANNED = "/etc /var /run /tmp /opt /root /srv /usr/local"


def sh(cmd: str, check: bool = True, timeout: int = 600):
    return sandbox_sh(cmd, check=check, timeout=timeout)


STAND_IN = """
import enum, sys, time, types
# metrics_collector imports ForwardMode from a module that loads sgl_kernel's CUDA ops (libcuda: no
# GPU here); it only names it in a helper. A stand-in enum takes its place; the collectors are real.
fb = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
fb.ForwardMode = enum.IntEnum("ForwardMode", "EXTEND DECODE MIXED IDLE")
sys.modules[fb.__name__] = fb
from prometheus_client import start_http_server
from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector, SchedulerStats, TokenizerMetricsCollector
from sglang.srt.server_args import ServerArgs
import dataclasses
# The engine's defaults without __post_init__ (that probes GPUs), as tests/sandbox/test_unit_secrets.py builds them.
args = object.__new__(ServerArgs)
for f in dataclasses.fields(ServerArgs):
    default = f.default if f.default is not dataclasses.MISSING else (
        f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
    object.__setattr__(args, f.name, default)
labels = {"model_name": "glm-5.3-flash"}
# The scheduler's labels as sglang's scheduler_metrics_mixin.py sets them for TP rank 0.
scheduler = SchedulerMetricsCollector(
    labels={**labels, "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}, server_args=args
)
tokenizer = TokenizerMetricsCollector(server_args=args, labels=labels)
stats = SchedulerStats()
stats.num_running_reqs, stats.num_queue_reqs, stats.token_usage, stats.gen_throughput = 1, 2, 0.25, 24.0
stats.spec_accept_length = 5.5
scheduler.log_stats(stats)
tokenizer.observe_time_to_first_token(labels, 1.5)
tokenizer.observe_inter_token_latency(labels, 0.5, 12)
tokenizer.observe_one_finished_request(labels, 1000, 12, 0, 2.0, False, 0)
start_http_server(int(sys.argv[1]), addr="127.0.0.1")
while True:
    time.sleep(60)
"""

LISTENER = """
import hashlib, http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"path": hashlib.sha256(self.path.encode()).hexdigest(), "body": body}) + "\\n")
        self.send_response(204)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def packages() -> set[str]:
    return set(sh("dpkg-query -W -f '${Package}\\n'").stdout.split())


def query(expr: str) -> list[dict]:
    out = sh(
        f"curl -sf --get --data-urlencode {shlex.quote('query=' + expr)} http://127.0.0.1:{port('prometheus')}/api/v1/query"
    ).stdout
    return json.loads(out)["data"]["result"]


def sandbox_scrape_config() -> dict:
    cwd = os.getcwd()
    os.chdir(REPO)  # the inventory reads .sandbox/ relative to the checkout
    try:
        cfg = scrape_config.config(runpy.run_path(SANDBOX_INVENTORY))
    finally:
        os.chdir(cwd)
    cfg["global"]["scrape_interval"] = cfg["global"]["evaluation_interval"] = "2s"
    return cfg


def test_prometheus_scrapes_the_node(sandbox):
    cfg = sandbox_scrape_config()
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in cfg["scrape_configs"]}
    assert set(jobs) == {"glm-flash-engine", "glm-flash-node"}
    engine_port = int(jobs["glm-flash-engine"][0].rsplit(":", 1)[1])
    assert (
        sh(f"systemctl is-active glm-flash.service; ss -Hltn 'sport = :{engine_port}'", check=False).stdout.split()[0]
        != "active"
    )
    before = packages()
    try:
        sh(f"mkdir -p {TEST_DIR} && systemctl mask prometheus.service")
        sh(
            "DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null",
            timeout=900,
        )
        sh(
            f"cat > {TEST_DIR}/prometheus.yml <<'EOF'\n{json.dumps(cfg)}\nEOF\n"
            f"cat > {TEST_DIR}/engine.py <<'EOF'\n{STAND_IN}\nEOF"
        )
        sh(f"systemd-run --unit=glm-flash-test-engine {PY} {TEST_DIR}/engine.py {engine_port}")
        sh(
            f"systemd-run --unit=glm-flash-test-prometheus /usr/bin/prometheus --config.file={TEST_DIR}/prometheus.yml "
            f"--storage.tsdb.path={TEST_DIR}/tsdb --web.listen-address=127.0.0.1:{port('prometheus')}"
        )
        deadline, up = time.time() + 120, []
        while time.time() < deadline:
            try:
                up = query("up")
            except Exception:  # noqa: BLE001 (not listening yet)
                up = []
            if len(up) == 2 and all(r["value"][1] == "1" for r in up):
                break
            time.sleep(2)
        assert {(r["metric"]["job"], r["value"][1]) for r in up} == {
            ("glm-flash-engine", "1"),
            ("glm-flash-node", "1"),
        }, up
        sglang = {m for m in DOCUMENTED if m.startswith("sglang:")}
        deadline, names = time.time() + 60, set()
        while time.time() < deadline:  # until a scrape of each has stored every series asked for below
            names = set(
                json.loads(sh(f"curl -sf http://127.0.0.1:{port('prometheus')}/api/v1/label/__name__/values").stdout)[
                    "data"
                ]
            )
            scraped = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in names}
            if SCRAPED_IN_SANDBOX <= names and sglang <= scraped:
                break
            time.sleep(1)
        # Host metrics, and the GPU collector's n/a: present 0, collector up.
        assert SCRAPED_IN_SANDBOX <= names, SCRAPED_IN_SANDBOX - names
        assert [r["value"][1] for r in query("glm_flash_gpu_present")] == ["0"]
        assert [(r["metric"]["reason"], r["value"][1]) for r in query("glm_flash_gpu_collector_up")] == [
            ("no GPU", "1")
        ]
        assert "glm_flash_gpu_memory_used_bytes" not in names  # n/a, not 0
        # The engine stand-in: every sglang metric the dashboard names, from the installed engine's own collectors.
        scraped = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in names}
        assert sglang <= scraped, (sglang - scraped, sorted(n for n in names if "sglang" in n)[:20], len(names))
        assert [r["value"][1] for r in query("sglang:num_queue_reqs")] == ["2"]
    finally:
        sh(
            "systemctl stop glm-flash-test-prometheus glm-flash-test-engine 2>/dev/null; "
            "systemctl reset-failed glm-flash-test-prometheus glm-flash-test-engine 2>/dev/null; "
            f"rm -rf {TEST_DIR}",
            check=False,
        )
        added = sorted(packages() - before)
        if added:
            sh(
                f"DEBIAN_FRONTEND=noninteractive apt-get purge -y {' '.join(added)} >/dev/null",
                check=False,
                timeout=600,
            )
        sh(
            "systemctl unmask prometheus.service; rm -rf /var/lib/prometheus/metrics2 /etc/prometheus; true",
            check=False,
        )
        assert packages() == before


FAILING = "glm-flash-test-fails.service"


def canary_holders() -> list[str]:
    """Files under SCANNED changed since MARKER was made that hold the canary. find -cnewer: a file's
    ctime cannot be set back, so whatever wrote the canary during the test is listed. No -xdev:
    systemd's credential mounts under /run are read as the recursive grep this replaced read them.
    Reads the few files written during the test, not the ~30 GB machine (183 s in CI)."""
    return sh(
        f"find {SCANNED} -type f -cnewer {MARKER} -print0 2>/dev/null | xargs -0 -r grep -lsF {CANARY} || true"
    ).stdout.split()


def notify_deploy(webhook: str | None):
    env_name = "GLM_FLASH_NOTIFY_WEBHOOK"
    saved = os.environ.pop(env_name, None)
    if webhook:
        os.environ[env_name] = webhook
    try:
        r = pyinfra(SANDBOX_INVENTORY, "tests/sandbox/notify_deploy.py", timeout=300)
    finally:
        os.environ.pop(env_name, None)
        if saved is not None:
            os.environ[env_name] = saved
    assert r.returncode == 0, r.stderr[-4000:]
    return r


def test_a_failed_unit_is_told_once_and_the_secret_stays_roots(sandbox):
    url = f"http://127.0.0.1:{port('webhook')}/hooks/{CANARY}"
    record = "/var/lib/glm-flash-notify/last-failure.json"
    saved_record = sh(f"cat {record} 2>/dev/null || true").stdout
    since = sh("date -u '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    sh(f"touch {MARKER} && sleep 0.01")  # a later write's ctime is past the marker's
    try:
        first = notify_deploy(url)
        assert CANARY not in first.stdout + first.stderr
        sh(f"mkdir -p {TEST_DIR}/told && chmod 777 {TEST_DIR}/told && chmod 755 {TEST_DIR}")
        sh(
            f"cat > {TEST_DIR}/listener.py <<'EOF'\n{LISTENER}\nEOF\n"
            f"cat > {TEST_DIR}/sink <<'EOF'\n#!/bin/sh\n{{ echo \"args: $*\"; cat; }} >> {TEST_DIR}/told/told\nEOF\n"
            f"chmod 755 {TEST_DIR}/sink"
        )
        # The listener records the path's hash: the canary stays out of its argv and its files.
        sh(
            f"systemd-run --unit=glm-flash-test-hook python3 {TEST_DIR}/listener.py {port('webhook')} {TEST_DIR}/posts.jsonl"
        )
        sh(
            f"cp /etc/glm-flash-notify/notify.json {TEST_DIR}/notify.json.orig && "
            f"printf '%s' '{json.dumps({'command': [f'{TEST_DIR}/sink'], 'lines': 5})}' > /etc/glm-flash-notify/notify.json"
        )
        sh(
            f"systemd-run --unit={FAILING} -p OnFailure=glm-flash-notify@{FAILING}.service -p Restart=on-failure "
            "-p RestartSec=4 -p StartLimitBurst=3 -p StartLimitIntervalSec=120 "
            "sh -c 'echo fail-line-one; echo fail-line-two; exit 3'"
        )
        notifier = f"glm-flash-notify@{FAILING}.service"
        deadline = time.time() + 120
        while time.time() < deadline:  # until the unit failed for good and the notifier ran to its end after that
            # One property: with several, --value prints them in systemd's order, not the order asked
            # (Result first: this loop once never saw "failed" and ran out its 120 s every time).
            state = sh(f"systemctl show {FAILING} -p ActiveState --value", check=False).stdout.strip()
            failed_at, told_at = (
                int(sh(f"systemctl show {u} -p InactiveEnterTimestampMonotonic --value").stdout.strip() or 0)
                for u in (FAILING, notifier)
            )
            told_state = sh(f"systemctl show {notifier} -p ActiveState --value").stdout.strip()
            if state == "failed" and told_state in ("inactive", "failed") and told_at > failed_at:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"{FAILING} did not fail for good with its notifier run after that within 120 s")
        sh("journalctl --sync")
        notifier_lines = sh(
            f"journalctl -q -o cat --since {shlex.quote(since)} -u 'glm-flash-notify@{FAILING}.service' "
            "| grep '^glm-flash-notify:' || true"
        ).stdout.splitlines()
        assert len(notifier_lines) >= 2, notifier_lines  # every failure runs it ...
        told = [line for line in notifier_lines if "; told:" in line]
        assert len(told) == 1 and "told: command (exit 0), webhook" in told[0], notifier_lines  # ... word goes once
        posts = [json.loads(line) for line in sh(f"cat {TEST_DIR}/posts.jsonl").stdout.splitlines()]
        assert len(posts) == 1 and posts[0]["path"] == hashlib.sha256(f"/hooks/{CANARY}".encode()).hexdigest(), posts
        assert posts[0]["body"]["unit"] == FAILING and "fail-line-two" in "\n".join(posts[0]["body"]["lines"])
        sink = sh(f"cat {TEST_DIR}/told/told").stdout
        assert sink.count("args: ") == 1 and sink.startswith(f"args: {FAILING}\n") and "fail-line-two" in sink
        rec = json.loads(sh(f"cat {record}").stdout)
        assert rec["unit"] == FAILING and rec["restarting"] is False
        # The secret: not in any process's argv or the journal (-o verbose: every field, _CMDLINE too) ...
        assert CANARY not in sh("ps -eo args").stdout
        assert (
            sh(f"journalctl -q -o verbose --since {shlex.quote(since)} | grep -c {CANARY} || true").stdout.strip()
            == "0"
        )
        # ... nor in a file anyone but root may read (the credential copy systemd made is gone with the run).
        holders = canary_holders()
        for path in holders:
            mode, owner = sh(f"stat -c '%a %U' {shlex.quote(path)}").stdout.split()
            assert owner == "root" and int(mode, 8) & 0o077 == 0, (
                f"{path} holds the webhook secret with mode {mode} {owner}"
            )
        assert "/etc/glm-flash-notify/webhook" in holders  # the scan lists a file the deploy wrote in this test
        assert not [p for p in holders if not p.startswith(("/etc/glm-flash-notify/", f"{TEST_DIR}/"))], holders
    finally:
        sh(
            f"systemctl stop glm-flash-test-hook {FAILING} 2>/dev/null; "
            f"systemctl reset-failed glm-flash-test-hook {FAILING} 'glm-flash-notify@{FAILING}.service' 2>/dev/null; "
            f"test -f {TEST_DIR}/notify.json.orig && cp {TEST_DIR}/notify.json.orig /etc/glm-flash-notify/notify.json; true",
            check=False,
        )
        notify_deploy(None)  # the sandbox inventory's notifier again: no webhook, its own settings
        if saved_record:
            sh(f"cat > {record} <<'EOF'\n{saved_record}EOF", check=False)
        else:
            sh(f"rm -f {record}", check=False)
        sh(f"rm -rf {TEST_DIR} {MARKER}", check=False)
    assert sh("test -e /etc/glm-flash-notify/webhook", check=False).returncode != 0
