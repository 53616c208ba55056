"""The rolling restart (roles/fleet/roll.py) and the worker key on the fleet sandbox: the real
router (sglang-router, deployed on node1 by roles/fleet/gateway.py) in front of the workers.

Simulated: no GPU here, so each worker's engine is an OpenAI-compatible stand-in
(tests/bench/fake_openai.py) on that worker's address, accepting only the gateway-to-worker key;
an engine's restart is the stand-in stopped (its connections dropped, as a dying process's are),
down for a second, and started again on the same address (a real engine's restart returns once
it answers a completion). The roll's steps (router API: out, drain, restart, back in and counted
healthy; one at a time; a broken restart stops it) are roles/fleet/roll.py's own, run as the
deploy runs them (Roll.restart, which the deploy's FunctionCommand calls); pyinfra's `_parallel`
ordering of the deploy's restart operation is not exercised here (no engine can start on these
machines).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import threading
import time
from types import SimpleNamespace

import jinja2
import pytest

from control.profile import build
from roles import service
from roles.fleet.gateway import ROUTER_JSON
from roles.fleet.roll import Roll, RouterApi
from tests.conftest import REPO
from tests.fleet.conftest import KEY, WORKER_KEY, ssh
from tests.fleet.test_gateway_fleet import Worker, base, chat, fleet, healthy, inventory, wait  # noqa: F401 (fleet: fixture)

pytestmark = pytest.mark.sandbox


def on_node1(args: list[str]) -> str:
    """RouterApi's `run` as the deploy's (roles/fleet/roll.py on_gateway): the gateway's own tool, run
    on node1 over SSH, calls the router there with the keys in node1's root-only files."""
    r = ssh("node1", shlex.join(["/opt/glm-flash-gateway/bin/glm-flash-gateway-launch", "workers", ROUTER_JSON, *args]))
    assert r.stdout.startswith('{"status"'), r.stderr  # the tool ran (its exit status: the answer's)
    return r.stdout


def restarted(workers: dict, url: str, ok: bool = True, api: RouterApi | None = None, listed_at_stop=None):
    """An engine restart: the stand-in stops, is down a second, and (ok) answers again. With `api`,
    whether the router still listed the worker when its engine stopped goes to `listed_at_stop`."""

    def restart() -> bool:
        if api is not None:
            listed_at_stop.append(api.find(url) is not None)
        workers[url].stop()
        time.sleep(1)
        if ok:
            workers[url] = Worker(url).__enter__()
        return ok

    return restart


class Clients:
    """Clients sending completions to the gateway while the roll runs, retrying a failed request as
    a client would (backoff 0.5 s, for up to 10 s); counts what no retry served."""

    def __init__(self, gw, n: int = 3):
        self.gw, self.stop, self.sent, self.retried, self.lost = gw, threading.Event(), 0, 0, []
        self.threads = [threading.Thread(target=self.loop, args=(i,)) for i in range(n)]

    def loop(self, i: int):
        while not self.stop.is_set():
            text = f"roll {i} {os.urandom(8).hex()} write a function"
            sent, codes = time.monotonic(), [chat(self.gw, text)]
            while codes[-1] != 200 and time.monotonic() - sent < 10:
                time.sleep(0.5)
                codes.append(chat(self.gw, text))
            self.sent += 1
            self.retried += len(codes) > 1
            if codes[-1] != 200:
                self.lost.append(codes)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()


def listed(gw) -> int:
    return sum(healthy(gw).values())


def test_a_rolling_restart_of_every_worker_loses_no_request(fleet):  # noqa: F811
    gw, workers = fleet
    wait(lambda: healthy(gw) == {u: True for u in workers}, 60)
    api = RouterApi(on_node1)
    roll = Roll(api, drain_s=2, back_timeout_s=60)
    listed_at_stop: list[bool] = []
    seen_in = []  # healthy workers the router lists, sampled through the roll
    sampling = threading.Event()

    def sample():
        while not sampling.is_set():
            seen_in.append(listed(gw))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample)
    sampler.start()
    with Clients(gw) as clients:
        time.sleep(2)
        for i, url in enumerate(list(workers)):
            assert roll.restart(f"worker{i}", url, restarted(workers, url, True, api, listed_at_stop), serving=True)
        time.sleep(2)
    sampling.set()
    sampler.join()
    print(
        f"{clients.sent} requests during the roll of {len(workers)} workers: {len(clients.lost)} failed that a "
        f"retry did not serve, {clients.retried} served after a retry; at most {roll.most_out} worker out at once"
    )
    assert clients.sent > 20
    assert clients.lost == [], clients.lost
    # Out of the gateway before each engine stopped: no request even needed a client's retry (without
    # the drain the router sends requests to the stopping engine until its health checks notice).
    assert listed_at_stop == [False] * len(workers) and clients.retried == 0
    assert roll.order == list(workers) and roll.most_out == 1 and not roll.failed
    # From the router's side: never fewer than all but one healthy, every worker back at the end.
    assert min(seen_in) >= len(workers) - 1, seen_in
    assert healthy(gw) == {u: True for u in workers}


def test_a_broken_restart_stops_the_roll_and_the_rest_serve(fleet):  # noqa: F811
    gw, workers = fleet
    wait(lambda: healthy(gw) == {u: True for u in workers}, 60)
    api = RouterApi(on_node1)
    roll = Roll(api, drain_s=1, back_timeout_s=60)
    (broken, _), *rest = workers.items()
    untouched = []
    try:
        with Clients(gw) as clients:
            assert not roll.restart("broken", broken, restarted(workers, broken, ok=False), serving=True)
            for url, _ in rest:
                assert not roll.restart("next", url, lambda u=url: untouched.append(u) or True, serving=True)
            time.sleep(3)
        assert untouched == [] and roll.failed == ["broken"]
        # The broken worker stays out of the gateway; the others were never taken out and serve.
        assert api.find(broken) is None and all(healthy(gw).get(u) for u, _ in rest)
        assert clients.lost == [], clients.lost
        print(f"{clients.sent} requests while the roll stopped at a broken worker: {len(clients.lost)} lost")
    finally:
        workers[broken] = Worker(broken).__enter__()
        api.add(broken, 60)  # what the next deploy's run does for a serving worker the router lacks


def test_a_worker_refuses_the_clients_key_and_takes_the_worker_key(fleet):  # noqa: F811
    """Through the gateway a completion is served by stand-ins that accept only the worker key (so
    the router sent that key); at a worker the clients' key is refused."""
    gw, workers = fleet
    url = next(iter(workers))
    assert chat(gw, "via the gateway") == 200
    host, port = url.split("//")[1].rsplit(":", 1)
    gw_at_worker = SimpleNamespace(
        gateway_listen_host=host, gateway_port=int(port), scheme="http"
    )  # chat() straight to it
    assert chat(gw_at_worker, "clients' key at a worker", key=KEY) == 401
    assert chat(gw_at_worker, "worker key at a worker", key=WORKER_KEY) == 200


def test_systemd_takes_the_workers_address_filter_and_bind_deny(fleet_up):
    """The engine unit as the deploy renders it for a fleet worker, loaded by the worker's systemd:
    the properties it parsed. Limit: the IPAddressDeny= filter is a cgroup BPF program, and the fleet
    sandbox's containers share the host's network on loopback addresses (which IPAddressAllow=localhost
    lets in), so whether the kernel drops other traffic is not shown here."""
    inv = inventory()
    name, data = inv["workers"][0]
    p = build(name, data, api_key_present=True)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(REPO / "templates"), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    text = env.get_template("glm-flash.service.j2").render(**service.unit_context(p, True, 257))
    node = next(n["name"] for n in fleet_up if n["address"] == p.fleet_own_address)
    write = subprocess.run(
        ["ssh", "-F", ".sandbox/fleet/ssh_config", node, "cat > /etc/systemd/system/glm-flash.service"],
        cwd=REPO,
        input=text,
        text=True,
        timeout=60,
    )
    assert write.returncode == 0
    try:
        out = ssh(
            node,
            "systemctl daemon-reload && systemctl show -p IPAddressDeny -p IPAddressAllow -p SocketBindDeny "
            "glm-flash.service",
        )
        assert out.returncode == 0, out.stderr
        props = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        gateway = inv["gateway"][0][1]["ssh_hostname"]
        assert set(props["IPAddressDeny"].split()) == {"0.0.0.0/0", "::/0"}, props
        allowed = props["IPAddressAllow"].split()
        assert {"127.0.0.0/8", "::1/128", f"{p.fleet_own_address}/32", f"{gateway}/32"} <= set(allowed), props
        assert "30080" in props["SocketBindDeny"], props
    finally:
        ssh(node, "rm -f /etc/systemd/system/glm-flash.service && systemctl daemon-reload")


def test_the_sandbox_inventory_gives_workers_the_worker_key_variable():
    inv = inventory()
    assert {d["api_key_env"] for _, d in inv["workers"]} == {"GLM_FLASH_WORKER_KEY"}
    assert inv["gateway"][0][1].get("api_key_env", "GLM_FLASH_API_KEY") == "GLM_FLASH_API_KEY"
