"""The gateway's router, as the host's state says it is now (roles/fleet/gateway.py)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable

from pyinfra import host, state
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.files import FileContents

from pyinfra_ext import memo
from pyinfra_ext.refusal import refusal
from roles.facts.engine import WheelhouseFiles
from roles.facts.service import RouterWorkers
from roles.facts.system import HostPython
from roles.operations.paths import replaced_whole


@operation()
def router_env_built(
    venv: str,
    marker: str,
    lock_sha: str,
    wheelhouse: str,
    wheels_for: Callable[[dict | None], list[str]],
    commands: list[str],
):
    """
    The router's environment is built from the lock whose sha256 is `lock_sha`, from wheels chosen
    for the gateway's own python3 (the HostPython fact, read when the operation runs: a bare host
    gets its python3 earlier in the same run), as the model downloader's are: not from `uname -m`.

    + venv: the environment the unit runs (a link to the built one)
    + marker: the file in it holding the sha256 of the lock it was built from
    + lock_sha: the lock's sha256
    + wheelhouse: the host's wheelhouse the build installs from
    + wheels_for: the host's HostPython fact -> the control machine's wheel files for it; raises
      OperationError (a refusal of this host, saying why) when none can be chosen
    + commands: the build's shell commands (roles/fleet/gateway.py venv_commands)
    """
    if (memo.fact(host, FileContents, path=posixpath.join(venv, marker)) or [""])[0].strip() == lock_sha:
        host.noop(f"gateway environment {venv} is built from this lock")
        return
    found = memo.fact(host, HostPython)
    if found is None and not state.is_executing:
        return  # planned on a bare host: python3 comes earlier in this run
    try:
        wheels = wheels_for(found)
    except OperationError as e:
        if not state.is_executing:
            raise  # planned: refusal.host_refusals refuses the host before anything runs
        yield refusal(str(e))
        return
    have = memo.fact(host, WheelhouseFiles, path=wheelhouse)
    for wheel in wheels:
        name = posixpath.basename(wheel)
        if have.get(name) != os.stat(wheel).st_size:
            yield from replaced_whole(wheel, f"{wheelhouse}/{name}", user="root", group="root", mode="644")
    for command in commands:
        yield StringCommand(command)


@operation()
def router_lists_only(tool: str, conf: str, urls: list[str]):
    """
    The gateway's router lists no worker but `urls`: one added through its worker API by anyone
    else (whoever held the key that guards it, an operator's test) is taken out, so the router
    sends clients' prompts to the inventory's workers only. Read when it runs, after the router's
    (re)start; a router that does not answer lists nothing to take out (it starts with `urls` only).

    + tool: glm-flash-gateway-launch on the gateway (it calls the router there with its own keys)
    + conf: the router's router.json, the keys' files beside it
    + urls: the inventory's workers (gateway_workers)
    """
    strangers = [w for w in memo.fact(host, RouterWorkers, tool=tool, conf=conf) or [] if w.get("url") not in urls]
    if not strangers:
        host.noop("the router lists the inventory's workers only")
        return
    for worker in strangers:
        # exits non-zero unless the router took it out (the JSON it prints says what it answered)
        yield StringCommand(QuoteString(tool), "workers", QuoteString(conf), "remove", QuoteString(str(worker["id"])))
