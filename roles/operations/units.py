"""systemd units enabled, checked from the run's memo; pyinfra's systemd.service enables them.

As roles/operations/paths.py: a check here may only be stricter than pyinfra's own.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.systemd import SystemdEnabled
from pyinfra.operations import systemd

from pyinfra_ext import memo
from roles.facts.service import ServiceStartState
from roles.operations.service_restart import restart_due


def enabled(unit: str, name: str):
    """unit: a full unit name (glm-flash.service). Enabling reloads systemd's unit files itself."""
    memo.want(host, SystemdEnabled, services=[unit])
    return _enabled(unit=unit, name=name)


@operation()
def _enabled(unit: str):
    """
    The unit enabled by pyinfra's systemd.service when it is not.

    + unit: a full unit name (glm-flash.service)
    """
    if memo.fact(host, SystemdEnabled, services=[unit]).get(unit):
        host.noop(f"{unit} is enabled")
        return
    yield from systemd.service._inner(service=unit, running=None, enabled=True)


def started_fresh(unit: str, unit_files: list[str], name: str, also: list[str] | None = None):
    """unit (a .timer or .service without readiness of its own) running from its unit files on disk:
    daemon-reload when systemd holds an older copy of it or of `also` (the units it starts), a
    restart when a unit file is newer than its last start or it is not running. Decided from
    the host's state (a run killed before the restart is caught up by the next)."""
    memo.want(host, ServiceStartState, service=unit, paths=list(unit_files), units=[unit, *(also or [])])
    return _started_fresh(unit=unit, unit_files=list(unit_files), also=list(also or []), name=name)


@operation()
def _started_fresh(unit: str, unit_files: list[str], also: list[str]):
    """
    The unit running from its unit files on disk: daemon-reload when systemd holds an older copy,
    a restart when a unit file is newer than its last start or it is not running.

    + unit: a .timer or .service without readiness of its own
    + unit_files: its files on disk (the unit, its drop-ins)
    + also: the units it starts, whose files systemd must hold as on disk too
    """
    state = memo.fact(host, ServiceStartState, service=unit, paths=unit_files, units=[unit, *also])
    if not restart_due(state, ("active", "reloading")):
        host.noop(f"{unit} runs from what is on disk")
        return
    if state.need_daemon_reload:
        yield "systemctl daemon-reload"
    yield StringCommand("systemctl restart", QuoteString(unit))


def loaded(units: list[str], name: str):
    """systemd holds the unit files on disk of `units` (a template's instance names it): daemon-reload otherwise."""
    memo.want(host, ServiceStartState, service=units[0], paths=[], units=list(units))
    return _loaded(units=list(units), name=name)


@operation()
def _loaded(units: list[str]):
    """
    systemd holds the unit files on disk of `units`: daemon-reload otherwise.

    + units: full unit names (for a template unit, an instance of it)
    """
    state = memo.fact(host, ServiceStartState, service=units[0], paths=[], units=units)
    if not state.need_daemon_reload:
        host.noop(f"systemd holds {', '.join(units)} as on disk")
        return
    yield "systemctl daemon-reload"
