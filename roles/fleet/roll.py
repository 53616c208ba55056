"""A rolling restart of the workers' engines behind the gateway: the fleet keeps serving while a
deploy upgrades it.

How it is ordered. pyinfra runs an operation on every host at once, one operation after the
other. The engine's restart is one operation of deploy.py (roles/service.py, started_from_disk:
it restarts when what the engine starts from changed, decided from the host's state); everything
before it (new engine environment, unit, flags) is prepared on every worker in parallel while the
old engines keep serving. On a fleet with a gateway, deploy_fleet.py registers this module's Roll
for the run (service.rolled_by) and that one operation then runs with pyinfra's `_parallel` set to
`roll_batch`: pyinfra runs it for `roll_batch` hosts, waits for them, then the next ones (in
pyinfra's order of its active hosts, a set: not the inventory's; the gateway host has no such
operation and takes a slot without doing anything).
For a worker whose engine is serving and due a restart the operation's command runs on the
control machine (a FunctionCommand, so one run does it in this order):

1. stop here if a worker of an earlier batch did not come back (its name is given);
2. take the worker out of the gateway (the router's worker API, DELETE /workers/{id}) and wait
   until the router no longer lists it; wait `roll_drain_s` so requests it holds finish;
3. restart its engine (`systemctl restart`, which returns once the engine answers a completion:
   the unit's readiness check), streaming the unit's journal;
4. put it back (POST /workers {url, api_key: the worker key}) and wait until the router counts it
   healthy; only then the next batch starts.

A worker whose restart fails stays out of the gateway, the operation fails on that host only, and
every later worker is left untouched (step 1): the rest serve on. A worker whose engine is not
serving (the first deploy, a broken one) is started without being taken out (it was not
serving), then put in the gateway when the router does not list it; one that does not start
stops the roll too.
A serving worker the router does not list (a roll stopped after taking it out) is put back by the
next run. The gateway unreachable (not deployed yet, down): nothing can be drained, so the engine
restarts as on a single node, said in the output. The router's API is called on the gateway
itself, over SSH (RouterApi): its tool there reads the clients' key (which guards the router's API)
and the worker key from the gateway's root-only files, so the roll sends no key over the network.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from pyinfra import host as current_host
from pyinfra.api import FunctionCommand, QuoteString, StringCommand
from pyinfra.api.exceptions import OperationError

from control.fleet import GATEWAY, gateway_profile, worker_url
from control.profile import Profile
from pyinfra_ext.host_args import connector_arguments
from roles import service
from roles.fleet.gateway import ROUTER_JSON, launcher


class Unreachable(Exception):
    """The gateway's API does not answer (SSH, the tool, or the router refused or timed out)."""


class RouterApi:
    """sglang-router's worker API (GET/POST /workers, DELETE /workers/{id}), as 0.3.2 serves it,
    called on the gateway itself: `run(args)` runs `glm-flash-gateway-launch workers ROUTER_JSON
    *args` there as root (over SSH: on_gateway) and returns what it printed. That tool reads the
    clients' key and the worker key from the gateway's root-only files and calls the router on the
    gateway's own address, so no key crosses the network or leaves the gateway."""

    def __init__(self, run: Callable[[list[str]], str]):
        self.run = run

    def _call(self, *args: str) -> tuple[int, bytes]:
        answer = json.loads(self.run(list(args)))
        if answer["status"] is None:
            raise Unreachable(answer["body"])
        return answer["status"], answer["body"].encode()

    def workers(self) -> list[dict]:
        code, out = self._call("list")
        if code != 200:
            raise OperationError(f"the gateway's GET /workers answered {code}: {out[:200]!r}")
        return json.loads(out)["workers"]

    def find(self, url: str) -> dict | None:
        return next((w for w in self.workers() if w["url"] == url), None)

    def remove(self, url: str, timeout_s: float) -> None:
        w = self.find(url)
        if w is None:
            return
        code, out = self._call("remove", w["id"])
        if code >= 300:
            raise OperationError(f"the gateway refused to take out {url}: {code} {out[:200]!r}")
        wait(lambda: self.find(url) is None, timeout_s, f"the gateway still lists {url}")

    def add(self, url: str, timeout_s: float) -> None:
        if self.find(url) is None:
            code, out = self._call("add", url)
            if code >= 300 and code != 409:
                raise OperationError(f"the gateway refused to add {url}: {code} {out[:200]!r}")
        wait(lambda: (self.find(url) or {}).get("is_healthy") is True, timeout_s, f"the gateway counts {url} unhealthy")


def wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise OperationError(f"{what} after {timeout_s:.0f} s")
        time.sleep(0.5)


def say(text: str) -> None:
    print(f"glm-flash roll: {text}", file=sys.stderr, flush=True)


class Roll:
    """One run's roll over the workers: who is out, who failed (then nobody else restarts)."""

    def __init__(self, api: RouterApi, drain_s: float, back_timeout_s: float = 600, batch: int = 1):
        self.api, self.drain_s, self.back_timeout_s, self.batch = api, drain_s, back_timeout_s, batch
        self.failed: list[str] = []
        self.out: set[str] = set()
        self.most_out = 0  # the most workers out of the gateway at once (tests/fleet checks it)
        self.order: list[str] = []  # workers in the order they were taken out

    def restart(self, name: str, url: str, restart: Callable[[], bool], serving: bool) -> bool:
        """Take `url` out, drain, restart (restart() says whether it came up), put it back. One
        that was not serving has nothing to drain: once it serves, it goes (back) in."""
        if self.failed:
            say(f"{name}: not restarted: the roll stopped at {', '.join(self.failed)}, which did not come back")
            return False
        if serving:
            try:
                self.api.remove(url, self.back_timeout_s)
            except Unreachable as e:
                say(f"{name}: {e}: restarting without taking it out of the gateway first")
                return restart()
            self.out.add(url)
            self.order.append(url)
            self.most_out = max(self.most_out, len(self.out))
            say(f"{name}: out of the gateway; draining {self.drain_s:g} s, then restarting its engine")
            time.sleep(self.drain_s)
        if not restart():
            came = "did not come back: it stays out of the gateway" if serving else "did not start"
            return self.stopped(name, f"its engine {came}")
        try:
            self.api.add(url, self.back_timeout_s)
        except Unreachable as e:
            if serving:
                return self.stopped(name, f"not back in the gateway ({e})")
            return True  # no gateway yet: it adds its workers when it starts
        except OperationError as e:
            return self.stopped(name, f"not {'back ' if serving else ''}in the gateway ({e})")
        if serving:
            self.out.discard(url)
            say(f"{name}: back in the gateway, counted healthy")
        return True

    def stopped(self, name: str, why: str) -> bool:
        """`name` failed: the roll stops here (no later worker restarts)."""
        self.failed.append(name)
        say(f"{name}: {why}; the roll stops here")
        return False

    def back_in(self, url: str) -> bool:
        """Whether a serving worker is listed by the router (False: a stopped roll left it out).
        True when the gateway does not answer: nothing to do from here."""
        try:
            return self.api.find(url) is not None
        except Unreachable:
            return True

    # --- what roles/service.py asks (through run_record, so that role imports nothing of the fleet) ---
    def parallel(self) -> int:
        return self.batch

    def command(self, restart_cmd, serving: bool) -> FunctionCommand:
        """The operation's one command for the current host: the steps above around `restart_cmd`."""
        url = worker_url(current_host.name, current_host.data.dict())
        return FunctionCommand(self._run, (url, restart_cmd, serving), {})

    def put_back(self) -> FunctionCommand | None:
        """For a serving worker that needs no restart: put it back when the router lacks it."""
        url = worker_url(current_host.name, current_host.data.dict())
        if self.back_in(url):
            return None
        return FunctionCommand(self._put_back, (url,), {})

    def _put_back(self, state, host, url: str) -> bool:
        self.api.add(url, self.back_timeout_s)
        say(f"{host.name}: put back in the gateway")
        return True

    def _run(self, state, host, url: str, restart_cmd, serving: bool) -> bool:  # pyinfra passes state and host
        def restart() -> bool:
            ok, _ = host.run_shell_command(
                restart_cmd, print_output=True, print_input=False, **connector_arguments(host)
            )
            return ok

        return self.restart(host.name, url, restart, serving)


def on_gateway(gw) -> Callable[[list[str]], str]:
    """Runs the gateway's worker-API tool on the gateway host over its own SSH connection (pyinfra's,
    opened here when this run does not include the gateway: `--limit workers`)."""
    tool = launcher(gateway_profile(gw.name, gw.data.dict()))

    def run(args: list[str]) -> str:
        if not gw.connected:
            gw.connect(reason="the roll calls the router's worker API there", show_errors=False)
        if not gw.connected:
            raise Unreachable(f"SSH to the gateway {gw.name} does not answer")
        command = StringCommand(tool, "workers", ROUTER_JSON, *(QuoteString(a) for a in args))
        _, out = gw.run_shell_command(command, print_output=False, print_input=False, **connector_arguments(gw))
        try:  # what the router answered, whatever it was (the tool exits non-zero on an error status)
            json.loads(out.stdout)
        except ValueError:  # the gateway is not deployed yet (no tool), or its tool failed
            raise Unreachable(f"{gw.name}: {tool} workers failed: {out.stderr[-300:]}") from None
        return out.stdout

    return run


def register(workers: Profile) -> None:
    """This run's engine restarts roll behind the inventory's gateway (none: as on single nodes)."""
    group = current_host.inventory.get_group(GATEWAY, None) if hasattr(current_host, "inventory") else None
    if not group:
        return
    api = RouterApi(on_gateway(group[0]))
    service.rolled_by(Roll(api, workers.roll_drain_s, batch=workers.roll_batch))
