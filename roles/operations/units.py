"""systemd units enabled, checked from the run's memo; pyinfra's systemd.service enables them.

As roles/operations/paths.py: a check here may only be stricter than pyinfra's own.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.systemd import SystemdEnabled
from pyinfra.operations import systemd

from pyinfra_ext import memo


def enabled(unit: str, name: str):
    """unit: a full unit name (glm-flash.service). Enabling reloads systemd's unit files itself."""
    memo.want(host, SystemdEnabled, services=[unit])
    return _enabled(unit=unit, name=name)


@operation()
def _enabled(unit: str):
    if memo.fact(host, SystemdEnabled, services=[unit]).get(unit):
        host.noop(f"{unit} is enabled")
        return
    yield from systemd.service._inner(service=unit, running=None, enabled=True)
