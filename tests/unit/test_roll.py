"""roles/fleet/roll.py's Roll with a router API stand-in (the real router: tests/fleet/test_fleet_roll*.py)."""

from __future__ import annotations

import http.server
import json
import socket
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
from fakehost import F, commands
from pyinfra.api.exceptions import OperationError

from roles.facts.service import RouterWorkers
from roles.fleet.roll import Roll, RouterApi, Unreachable, on_gateway
from roles.operations.gateway import router_lists_only
from tests.conftest import REPO


class Api:
    def __init__(self, urls, reachable=True):
        self.listed, self.reachable, self.calls = list(urls), reachable, []

    def remove(self, url, timeout_s):
        if not self.reachable:
            raise Unreachable("down")
        self.calls.append(("remove", url))
        self.listed.remove(url)

    def add(self, url, timeout_s):
        if not self.reachable:
            raise Unreachable("down")
        self.calls.append(("add", url))
        if url not in self.listed:
            self.listed.append(url)

    def find(self, url):
        if not self.reachable:
            raise Unreachable("down")
        return {"url": url} if url in self.listed else None


def test_each_worker_is_out_while_it_restarts_and_back_after():
    api = Api(["a", "b"])
    roll = Roll(api, drain_s=0)
    seen = []
    for url in ("a", "b"):
        assert roll.restart(url, url, lambda u=url: seen.append(api.find(u)) or True, serving=True)
    assert seen == [None, None] and api.calls == [("remove", "a"), ("add", "a"), ("remove", "b"), ("add", "b")]
    assert roll.most_out == 1 and sorted(api.listed) == ["a", "b"]


def test_a_failed_restart_stops_the_roll_and_leaves_the_worker_out():
    api = Api(["a", "b"])
    roll = Roll(api, drain_s=0)
    assert not roll.restart("a", "a", lambda: False, serving=True)
    touched = []
    assert not roll.restart("b", "b", lambda: touched.append("b") or True, serving=True)
    assert touched == [] and api.listed == ["b"] and roll.failed == ["a"]


def test_without_a_gateway_the_engine_restarts_as_on_a_single_node():
    roll = Roll(Api(["a"], reachable=False), drain_s=0)
    assert roll.restart("a", "a", lambda: True, serving=True) and not roll.failed
    assert roll.back_in("a")  # nothing to put back from here


def test_a_worker_that_was_not_serving_is_started_then_put_in():
    api = Api([])
    roll = Roll(api, drain_s=0)
    assert roll.restart("a", "a", lambda: True, serving=False) and api.calls == [("add", "a")]
    assert not Roll(Api([]), drain_s=0).restart("b", "b", lambda: False, serving=False)


# --- the router's worker API, called on the gateway (the tool the roll runs there over SSH) -------

TOOL = REPO / "files" / "glm-flash-gateway-launch"


class Router(http.server.BaseHTTPRequestHandler):
    """sglang-router 0.3.2's worker API as the tool sees it: records each request."""

    seen: list = []
    listed = [{"id": "w/1", "url": "http://10.0.0.11:30000", "is_healthy": True}]

    def _answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(size)) if size else None
        Router.seen.append((self.command, self.path, self.headers.get("Authorization"), body))

    def do_GET(self):
        self._record()
        self._answer(200, {"workers": Router.listed})

    def do_POST(self):
        self._record()
        self._answer(202, {"status": "accepted"})

    def do_DELETE(self):
        self._record()
        self._answer(404, {"error": "no such worker"})

    def log_message(self, *args):
        pass


@pytest.fixture
def router(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Router)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    conf = tmp_path / "router.json"
    conf.write_text(json.dumps({"args": ["--host", "0.0.0.0", "--port", str(server.server_address[1])]}))
    (tmp_path / "api-key").write_text("clients-key-0123456789\n")
    (tmp_path / "worker-key").write_text("worker-key-0123456789\n")
    Router.seen = []
    yield conf
    server.shutdown()


def on_this_machine(conf, argv_seen: list):
    """RouterApi's `run` as on_gateway's, with the tool run here instead of over SSH."""

    def run(args):
        argv = [sys.executable, str(TOOL), "workers", str(conf), *args]
        argv_seen.append(argv)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        status = json.loads(r.stdout)["status"]  # and the exit status says the same
        assert r.returncode == (3 if status is None else 0 if status < 300 else 4), (r.returncode, r.stdout)
        return r.stdout

    return run


def test_the_tool_calls_the_routers_worker_api_with_the_gateways_own_keys(router):
    argv: list = []
    api = RouterApi(on_this_machine(router, argv))
    assert api.find("http://10.0.0.11:30000")["id"] == "w/1"
    with pytest.raises(OperationError, match="the gateway refused to take out http://10.0.0.11:30000: 404"):
        api.remove("http://10.0.0.11:30000", timeout_s=1)
    Router.listed = [*Router.listed, {"id": "w2", "url": "http://10.0.0.12:30000", "is_healthy": True}]
    api._call("add", "http://10.0.0.13:30000")
    bearer = "Bearer clients-key-0123456789"
    assert Router.seen == [
        ("GET", "/workers", bearer, None),
        ("GET", "/workers", bearer, None),
        ("DELETE", "/workers/w%2F1", bearer, None),
        # the worker key goes to the router in the body, read from the gateway's file
        ("POST", "/workers", bearer, {"url": "http://10.0.0.13:30000", "api_key": "worker-key-0123456789"}),
    ]
    # Neither key is in a command line: the roll's SSH command names only the action and the worker.
    assert not any("key-0123456789" in a for args in argv for a in args)


def test_a_router_that_does_not_answer_is_unreachable_not_a_failure(tmp_path):
    conf = tmp_path / "router.json"
    with socket.socket() as s:  # a port nothing listens on: bound, never listening
        s.bind(("127.0.0.1", 0))
        conf.write_text(json.dumps({"args": ["--port", str(s.getsockname()[1])]}))
        with pytest.raises(Unreachable, match="does not answer"):
            RouterApi(on_this_machine(conf, [])).workers()


def test_on_gateway_runs_the_tool_on_the_gateway_host_as_its_inventory_reaches_it():
    ran = []

    class Gateway:
        name, connected = "gw.lan", True
        data = SimpleNamespace(
            dict=lambda: {
                "ssh_hostname": "10.0.0.2",
                "_sudo": True,
                "gateway_listen_host": "127.0.0.1",
                "gateway_workers": ["http://10.0.0.11:30000"],
            }
        )

        def run_shell_command(self, command, **kw):
            ran.append(command.get_raw_value())  # who runs it (sudo): connector_arguments, from its data
            return True, SimpleNamespace(stdout='{"status": 200, "body": "{\\"workers\\": []}"}', stderr="")

    assert RouterApi(on_gateway(Gateway())).workers() == []
    assert ran == [
        "/opt/glm-flash-gateway/bin/glm-flash-gateway-launch workers /etc/glm-flash-gateway/router.json list"
    ]


# --- the deploy takes out of the router every worker the inventory does not name ----------------

GW_TOOL, GW_CONF = "/opt/glm-flash-gateway/bin/glm-flash-gateway-launch", "/etc/glm-flash-gateway/router.json"
INVENTORY = ["http://10.0.0.11:30000", "http://10.0.0.12:30000"]


def listed_by_router(*urls: str) -> list[dict]:
    """RouterWorkers as it parses the tool's answer to `list` on a router listing `urls`."""
    body = json.dumps({"workers": [{"id": f"id-{i}", "url": u, "is_healthy": True} for i, u in enumerate(urls)]})
    return RouterWorkers.parse([json.dumps({"status": 200, "body": body})])


def test_a_worker_added_by_anyone_else_is_taken_out_and_the_inventorys_stay():
    facts = {F(RouterWorkers, tool=GW_TOOL, conf=GW_CONF): listed_by_router(*INVENTORY, "http://203.0.113.9:80")}
    assert commands(router_lists_only, facts, tool=GW_TOOL, conf=GW_CONF, urls=INVENTORY) == [
        f"{GW_TOOL} workers {GW_CONF} remove id-2"
    ]


def test_a_router_with_the_inventorys_workers_or_none_answering_is_left_alone():
    for listed in (listed_by_router(*INVENTORY), listed_by_router(INVENTORY[0]), None):
        facts = {F(RouterWorkers, tool=GW_TOOL, conf=GW_CONF): listed}
        assert commands(router_lists_only, facts, tool=GW_TOOL, conf=GW_CONF, urls=INVENTORY) == []
    # the tool's answers that are not a list: nothing to take out (None), never a parse error
    assert RouterWorkers.parse([json.dumps({"status": None, "body": "does not answer"})]) is None
    assert RouterWorkers.parse([json.dumps({"status": 401, "body": "unauthorized"})]) is None
    assert RouterWorkers.parse([]) is None
