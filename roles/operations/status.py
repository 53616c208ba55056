"""The summary's last operation: read what the host serves now (roles/summary.py prints it)."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import OperationError, operation

from pyinfra_ext import memo
from roles.facts.status import Answers, HostStatus


@operation(is_idempotent=True)
def gathered(tool: str, planned: dict, into: dict, reboot, summarize):
    """
    Read what the host serves now into `into` (by host name), for the summary printed when the
    run ends: summarize(planned, `tool status --json --quick`, reboot() or []).

    + tool: glm-flash on the host
    + planned: what this run planned for the host (engine, model commit, endpoint)
    + into: the run's summaries, by host name
    + reboot: a function returning why a reboot is pending, or None
    + summarize: makes the summary from planned, the status and the reboot reasons
    """
    if not host.get_fact(Answers):
        raise OperationError(f"{host.name} no longer answers; its summary cannot be read")
    status = memo.fact(host, HostStatus, tool=tool)
    into[host.name] = summarize(planned, status, reboot() if reboot else [])
    host.noop("summary gathered (printed at the end)")
    yield from ()


@operation(is_idempotent=True)
def recorded(planned: dict, into: dict):
    """
    Put `planned` into `into` (by host name) when the run gets this far, for the summary of a host
    without glm-flash status (the fleet's gateway): its last operation, so a run stopped before it
    says so.

    + planned: what this run deployed on the host (the endpoint, the workers)
    + into: the run's summaries, by host name
    """
    into[host.name] = dict(planned)
    host.noop("summary recorded (printed at the end)")
    yield from ()
