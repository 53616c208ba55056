"""No desktop on a serving node (roles/headless.py): each state an operation reading the host when it runs."""

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.operations import systemd

from control.report import skipped
from control.run import dry_run
from pyinfra_ext import memo
from roles.facts.system import DefaultTarget, GpuProcesses, Gpus, UnitFiles


@operation()
def default_target(target: str):
    """
    Boot into `target`.

    + target: a systemd target unit
    """
    if memo.fact(host, DefaultTarget) == target:
        host.noop(f"default target is {target}")
        return
    yield StringCommand("systemctl", "set-default", QuoteString(target))


@operation()
def desktop_stopped(display_managers: list[str]):
    """
    Stop and disable every display manager the host has.

    + display_managers: unit names without .service (the ones absent on the host are skipped)
    """
    names = [f"{dm}.service" for dm in display_managers]
    units = memo.fact(host, UnitFiles, units=names)
    present = [name for name in names if name in units]
    if not present:
        host.noop("no display manager installed")
        return
    for unit in present:
        yield from systemd.service._inner(service=unit, running=False, enabled=False)


@operation()
def gpu_free_of_desktop(tool: str):
    """
    Ask the preflight tool to end desktop processes holding GPU memory, when there are any.

    + tool: glm-flash-preflight on the host
    """
    if not memo.fact(host, Gpus):
        if host.state.is_executing or dry_run():  # once per run: without -y it also runs at prepare
            skipped("desktop GPU memory check", "no NVIDIA GPU on this host")
        host.noop("no NVIDIA GPU on this host: no desktop process can hold GPU memory")
        return
    held = [p for p in memo.fact(host, GpuProcesses) if p.is_desktop]
    if not held:
        host.noop("no desktop process holds GPU memory")
        return
    yield StringCommand(QuoteString(tool), "desktop")
