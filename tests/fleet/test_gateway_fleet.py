"""The gateway on the fleet sandbox: sglang-router deployed by roles/fleet/gateway.py on node1, in front of
the workers node2.. (`make fleet-up N=3`; booted here when it is not up, and removed after).

Simulated: no GPU here, so each worker's engine is an OpenAI-compatible stand-in
(tests/bench/fake_openai.py, accepting only the gateway-to-worker key, as a deployed worker's
engine does) listening on that worker's loopback address; the containers share
the host's network, so it is the address the gateway reaches. The router, its health checks,
its key check, its systemd unit and the deploy are the real ones.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from unittest import mock

import pytest

from control.fleet import gateway_profile
from roles.fleet.gateway import ROUTER_JSON
from tests.bench.fake_openai import FakeOpenAI
from tests.conftest import REPO
from tests.fleet.conftest import CA_DIR, KEY, WORKER_KEY, env, ssh

pytestmark = pytest.mark.sandbox


class Worker(FakeOpenAI):
    """A stand-in engine whose stop() also drops the connections it has open, as a dying process's
    do (the router keeps connections alive; the stand-in's threads would go on serving them)."""

    def __init__(self, url: str):
        host, port = url.split("//")[1].rsplit(":", 1)
        super().__init__(host=host, port=int(port), api_key=WORKER_KEY, tok_s=400, lifetime_s=1800)
        self.conns: list[socket.socket] = []
        serve = self.httpd.process_request

        def track(request, client_address):
            self.conns.append(request)
            serve(request, client_address)

        self.httpd.process_request = track

    def stop(self):
        super().stop()
        for conn in self.conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def inventory() -> dict:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, runpy; ns = runpy.run_path('inventory/fleet_sandbox.py'); "
            "print(json.dumps({'workers': ns['workers'], 'gateway': ns['gateway']}))",
        ],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def fleet(fleet_up):
    name, data = inventory()["gateway"][0]
    with mock.patch.dict(os.environ, {"GLM_FLASH_API_KEY": KEY, "GLM_FLASH_WORKER_KEY": WORKER_KEY}):
        gw = gateway_profile(name, data)
    # The engines are up before the gateway (re)starts, as on a fleet whose gateway is deployed last.
    workers = {url: Worker(url).__enter__() for url in gw.gateway_workers}
    run = gateway_deploy()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    yield gw, workers
    for w in workers.values():
        w.stop()


def base(gw) -> str:
    """Where clients reach the fleet: the front door, over TLS (a worker reached straight: its scheme)."""
    return f"{getattr(gw, 'scheme', 'https')}://{gw.gateway_listen_host}:{gw.gateway_port}"


def trust() -> ssl.SSLContext:
    """A client that trusts the fleet's authority only (the one the deploy's env() names)."""
    return ssl.create_default_context(cafile=str(CA_DIR / "ca.crt"))


def call(gw, path: str, body: dict | None = None, key: str | None = KEY, url: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(url or base(gw) + path, data=json.dumps(body).encode() if body else None)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    https = req.full_url.startswith("https:")
    try:
        with urllib.request.urlopen(req, timeout=30, context=trust() if https else None) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError as e:
        return 0, str(e).encode()


def chat(gw, text: str, key: str | None = KEY, max_tokens: int = 40) -> int:
    body = {
        "model": "glm-5.3-flash",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    code, out = call(gw, "/v1/chat/completions", body, key)
    return code if code != 200 or b"[DONE]" in out else -1


def router(gw) -> str:
    """The router itself, on the gateway's loopback: clients never reach it (the front door forwards
    no /workers). The fleet's machines share this machine's loopback, so the test reads the router's
    view of its workers there, with the key guarding its API (the deploy and the roll call it over
    SSH on the gateway instead: roles/fleet/roll.py)."""
    return f"http://127.0.0.1:{gw.gateway_router_port}"


def healthy(gw) -> dict[str, bool]:
    code, out = call(gw, "", url=router(gw) + "/workers")
    return {w["url"]: w["is_healthy"] for w in json.loads(out)["workers"]} if code == 200 else {}


def wait(cond, timeout: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s")


def burst(gw, n: int, tag: str, max_tokens: int = 40) -> list[int]:
    """n requests at once: they start together (a barrier), however late a loaded machine runs each thread."""
    codes = [None] * n
    start = threading.Barrier(n)

    def one(i):
        start.wait(timeout=60)
        codes[i] = chat(gw, f"{tag} {i} {os.urandom(8).hex()} write a function", max_tokens=max_tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


def window(gw, checks: int) -> float:
    """How long the router may take to decide: `checks` health checks in a row, the last one timing out."""
    return checks * gw.gateway_health_interval_s + gw.gateway_health_timeout_s


def allowed(gw, checks: int) -> float:
    """window() with room for a loaded machine (2 cores, other jobs): one more health interval and 5 s.
    The claim is that the deploy's health-check flags rule (--health-check-interval-secs ...): a
    router that needed two more intervals than configured, or ran on other settings, would not fit."""
    return window(gw, checks) + gw.gateway_health_interval_s + 5


def gateway_deploy() -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory/fleet_sandbox.py", "deploy_fleet.py", "--limit", "gateway"],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=1200,
    )


def test_a_second_gateway_deploy_changes_nothing_and_its_summary_says_where_clients_go(fleet):
    run = gateway_deploy()
    out = run.stdout + run.stderr
    totals = [line for line in out.splitlines() if "Grand total" in line][0].split()
    assert run.returncode == 0 and totals[-3:] == ["-", "-", totals[-4]], out[-2000:]
    # the gateway ran to its last operation: deployed, where its clients go, what stands behind it
    gw, _ = fleet
    name, _ = inventory()["gateway"][0]
    summary = out[out.rindex("--> Summary") :].splitlines()
    at = summary.index(f"    [{name}] deployed")
    said = summary[at + 1 : at + 3]
    assert said[0].startswith(f"        endpoint: {base(gw)}/v1 (TLS"), summary  # where clients go
    assert said[1] == f"        workers: {', '.join(gw.gateway_workers)}", summary


def test_a_client_with_the_key_cannot_reach_the_routers_worker_api(fleet):
    """The clients' key also guards the router's /workers (sglang-router has one key): through the
    front door a client gets 404 for it, in any spelling, and its requests reach only the inventory's workers."""
    gw, workers = fleet
    first = next(iter(workers))
    stranger = first.rsplit(".", 1)[0] + ".251:" + first.rsplit(":", 1)[1]  # an address no node has
    with Worker(stranger) as planted:
        for path in (
            "/workers",
            "/workers/",
            "//workers",
            "/v1/models/../../workers",
            "/v1/models%2F..%2F..%2Fworkers",
        ):
            code, out = call(gw, path, {"url": stranger, "api_key": WORKER_KEY})
            assert code == 404, (path, code, out)
            assert call(gw, path)[0] == 404 and call(gw, path, key=None)[0] == 404
        for path in ("/flush_cache", "/get_server_info", "/list_workers", "/get_loads"):
            assert call(gw, path)[0] == 404, path
        assert stranger not in healthy(gw)
        assert burst(gw, 6, "only the inventory's") == [200] * 6 and planted.generations == 0
    assert sorted(healthy(gw)) == sorted(workers)


def test_clients_reach_the_front_door_over_tls_with_the_fleets_certificate_only(fleet):
    gw, _ = fleet
    with socket.create_connection((gw.gateway_listen_host, gw.gateway_port), timeout=10) as raw:
        with trust().wrap_socket(raw, server_hostname=gw.gateway_listen_host) as tls:
            cert = tls.getpeercert()
            assert ("IP Address", gw.gateway_listen_host) in cert["subjectAltName"], cert
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    # A client trusting only the system's authorities refuses it: the fleet's is its own.
    with socket.create_connection((gw.gateway_listen_host, gw.gateway_port), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            ssl.create_default_context().wrap_socket(raw, server_hostname=gw.gateway_listen_host)
    # Plain HTTP on the client port is not served: nginx answers 400, and no key reaches the router.
    code, out = call(gw, "", url=base(gw).replace("https:", "http:") + "/v1/models")
    assert code == 400 and b"plain HTTP request was sent to HTTPS port" in out, (code, out[:200])


def test_one_client_address_is_held_to_its_rate(fleet):
    """gateway_requests_per_s (60 here): 800 requests for /health as fast as 16 connections go get
    429s beyond a second's worth; a second later the same client is served again."""
    gw, _ = fleet
    codes: list[int] = []

    def client():
        conn = http.client.HTTPSConnection(gw.gateway_listen_host, gw.gateway_port, timeout=30, context=trust())
        try:
            for _ in range(50):
                conn.request("GET", "/health")
                response = conn.getresponse()
                response.read()
                codes.append(response.status)
        finally:
            conn.close()

    threads = [threading.Thread(target=client) for _ in range(16)]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - started
    counts = {c: codes.count(c) for c in set(codes)}
    assert set(counts) <= {200, 429} and counts.get(429, 0) > 0, (counts, took)
    # Served: at most the rate over the time it took, plus the burst (and one second of slack).
    assert counts.get(200, 0) <= gw.gateway_requests_per_s * (took + 2), (counts, took)
    time.sleep(1.5)
    assert call(gw, "/health", key=None)[0] == 200


def test_a_worker_the_inventory_does_not_name_is_taken_out_by_the_next_deploy(fleet):
    """A worker added on the gateway itself (clients cannot: the test above), as root or the router's
    own key could: the next deploy takes it out."""
    gw, workers = fleet
    first = next(iter(workers))
    stranger = first.rsplit(".", 1)[0] + ".250:" + first.rsplit(":", 1)[1]  # an address no node has
    assert stranger not in workers
    with Worker(stranger) as planted:
        tool = f"{gw.gateway_dir}/bin/glm-flash-gateway-launch"
        added = ssh("node1", f"{tool} workers {ROUTER_JSON} add {stranger}")
        assert added.returncode == 0, added.stdout + added.stderr
        wait(lambda: healthy(gw).get(stranger) is True, 60)
        run = gateway_deploy()
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-3000:]
        assert healthy(gw) == {u: True for u in workers}, healthy(gw)
        served_before = planted.generations
        assert burst(gw, 6, "after the deploy") == [200] * 6 and planted.generations == served_before
    run = gateway_deploy()  # and that converged: nothing left to take out
    totals = [line for line in (run.stdout + run.stderr).splitlines() if "Grand total" in line][0].split()
    assert run.returncode == 0 and totals[-3:] == ["-", "-", totals[-4]], run.stdout[-2000:]


def test_requests_spread_over_the_workers(fleet):
    gw, workers = fleet
    wait(lambda: healthy(gw) == {u: True for u in workers}, 60)
    before = {u: w.generations for u, w in workers.items()}
    # 400 tokens at the stand-in's 400 tok/s: each request is in flight for a second, so the 16 overlap
    # and the router's load balancing (threshold 1) must spread them.
    codes = burst(gw, 16, "spread", max_tokens=400)
    assert codes == [200] * 16
    served = {u: w.generations - before[u] for u, w in workers.items()}
    assert sum(served.values()) == 16 and all(n > 0 for n in served.values()), served


def test_a_request_without_the_key_is_refused(fleet):
    gw, workers = fleet
    before = sum(w.generations for w in workers.values())
    assert chat(gw, "no key", key=None) == 401
    assert chat(gw, "wrong key", key="not-" + KEY) == 401
    assert sum(w.generations for w in workers.values()) == before, "a refused request reached a worker"


def test_gateway_host_checks_pass(fleet):
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "tests/host/test_gateway.py",
            "tests/host/test_exposure.py",
            "--no-deploy",
            "--inventory",
            "inventory/fleet_sandbox.py",
            "--hosts",
            "ssh://node1",
            "--ssh-config",
            ".sandbox/fleet/ssh_config",
            "-p",
            "no:cacheprovider",
        ],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and " passed" in run.stdout and "skipped" not in run.stdout, run.stdout[-3000:]


def test_a_stopped_worker_is_taken_out_then_put_back(fleet):
    gw, workers = fleet
    (dead_url, dead), *rest = workers.items()
    wait(lambda: all(healthy(gw).values()) and len(healthy(gw)) == len(workers), 60)
    dead.stop()
    stopped = time.monotonic()
    lost, retried, waited = [], 0, 0.0
    # Keep sending while the router notices: a request may fail once, a retry must be served.
    while healthy(gw).get(dead_url, True):
        if time.monotonic() - stopped > allowed(gw, gw.gateway_health_failures):
            pytest.fail(f"{dead_url} still counted healthy {time.monotonic() - stopped:.1f} s after it stopped")
        text = f"during {os.urandom(8).hex()}"
        sent, codes = time.monotonic(), [chat(gw, text)]
        # A client retries the same request with a backoff. Cache-aware routing sends a prompt to the
        # worker holding its prefix, so until the health checks take that worker out, retries of it
        # fail fast (500) there too; after, another worker serves it.
        while codes[-1] != 200 and time.monotonic() - sent < allowed(gw, gw.gateway_health_failures):
            time.sleep(0.5)
            codes.append(chat(gw, text))
        if len(codes) > 1:
            retried += 1
            waited = max(waited, time.monotonic() - sent)
        if codes[-1] != 200:
            lost.append((round(sent - stopped, 1), codes))
        time.sleep(0.1)
    taken_out = time.monotonic() - stopped
    assert not lost, f"requests no retry served (seconds after the stop, statuses): {lost}"
    # Out: everything goes to the others, at the first try.
    before = sum(w.generations for _, w in rest)
    assert burst(gw, 8, "after") == [200] * 8
    assert sum(w.generations for _, w in rest) - before == 8
    # Back: the same address answers again and gets traffic after `gateway_health_successes` checks.
    workers[dead_url] = back = Worker(dead_url).__enter__()
    put_back = wait(lambda: healthy(gw).get(dead_url) is True, allowed(gw, gw.gateway_health_successes))
    # Requests that failed on it may have opened its circuit breaker: traffic returns once that half-opens.
    start = time.monotonic()
    while back.generations == 0 and time.monotonic() - start < gw.gateway_breaker_open_s + 8:
        assert burst(gw, 8, "back") == [200] * 8
        time.sleep(0.5)
    assert back.generations > 0, "the restarted worker got no traffic back"
    print(
        f"taken out after {taken_out:.1f} s, {retried} request(s) retried (served within {waited:.1f} s); "
        f"healthy again after {put_back:.1f} s, "
        f"served again after {put_back + time.monotonic() - start:.1f} s"
    )
