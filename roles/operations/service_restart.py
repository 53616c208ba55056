"""Restart a service when what it started from is older than what is on disk, decided from
the host's state at run time, not from what changed in this run: a run killed after a
config upload or an engine switch and before its restart is caught up by the next run."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from pyinfra_ext import memo
from roles.facts.service import ServiceStartState
from roles.operations.job import followed

RUNNING = ("active", "activating", "reloading")


@operation()
def started_from_disk(
    service: str, inputs: list[str], units: list[str] | None = None, can_serve: bool = True, roll=None
):
    """
    Restart (or start) `service` unless it started after its inputs last changed.

    + service: the unit to (re)start, e.g. glm-flash.service
    + inputs: files (and symlinks, taken as themselves) its start reads: the unit file, its
      environment and launch files, credentials, the engine's `current` link
    + units: unit files whose NeedDaemonReload asks for a daemon-reload first (default: service)
    + can_serve: the host can run the engine (a GPU): the start job is waited for (the service's
      own readiness check) and must succeed. False (no GPU): the start is tried, fails fast in
      its preflight, and the automatic retries (Restart=on-failure) are cancelled; that attempt
      is what the next run compares against.
    + roll: in a fleet behind a gateway (roles/fleet/roll.py): the restart of a serving engine is
      wrapped in its command (out of the gateway, drain, restart, back in, healthy); a serving
      engine that needs no restart is put back in the gateway when a stopped roll left it out.

    Restarts when: systemd still has an older unit loaded (NeedDaemonReload), an input is newer
    than the last start (InactiveExitTimestamp), or, can_serve, the service is not running.
    """
    if not service.endswith(".service") or not inputs:
        raise OperationError(f"started_from_disk: a .service unit and its input files, got {service!r}, {inputs!r}")
    state = memo.fact(host, ServiceStartState, service=service, paths=list(inputs), units=units or [service])
    if not restart_due(state, RUNNING if can_serve else None):
        back = roll.put_back() if roll and can_serve else None
        if back is not None:
            yield back
            return
        host.noop(f"{service} started from what is on disk ({state.active_state})")
        return
    if state.need_daemon_reload:
        yield "systemctl daemon-reload"
    unit = QuoteString(service)
    # A unit that hit its start limit refuses starts until reset; this start is on purpose.
    yield StringCommand("systemctl reset-failed", unit, "2>/dev/null || true")
    if can_serve:
        # The start returns once readiness (ExecStartPost) passes, up to startup_timeout_s: the
        # unit's journal lines (the engine's load, readiness's "not ready after N s") stream to
        # the deploy's output meanwhile.
        if roll:
            yield roll.command(restart_followed(unit), serving=state.active_state in RUNNING)
            return
        yield followed(service, restart_followed(unit))
        return
    yield StringCommand("systemctl restart", unit, "|| true")
    yield StringCommand("systemctl stop", unit)


def restart_due(state, running: tuple[str, ...] | None) -> bool:
    """Whether a unit must be (re)started from its files on disk (no: it runs from them): systemd
    holds an older copy of a unit, an input is newer than its last start, or it is not in one of
    the `running` states (None: whether it runs does not matter)."""
    stopped = running is not None and state.active_state not in running
    return state.need_daemon_reload or state.newest_input[0] > state.last_start or stopped


def restart_followed(unit: QuoteString) -> StringCommand:
    """`systemctl restart UNIT` (its exit status) with the unit's new journal lines printed while it runs."""
    return StringCommand(
        "journalctl --no-pager -f -n 0 -o cat -u",
        unit,
        "& j=$!; systemctl restart",
        unit,
        "; rc=$?; sleep 1; kill $j; exit $rc",
    )
