"""No desktop on a serving node: it held 0.5-0.7 GiB on GPU 0 in the field.

Three states, each an operation that reads the host when it runs: the default target is
multi-user, no display manager runs or starts at boot, and no desktop process holds GPU memory.
"""

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.operations import systemd

from control import layout
from control.profile import Profile
from control.report import skipped
from control.run import dry_run
from roles.facts.system import DefaultTarget, GpuProcesses, Gpus, UnitFiles

TARGET = "multi-user.target"


@operation()
def default_target(target: str):
    """
    Boot into `target`.

    + target: a systemd target unit
    """
    if host.get_fact(DefaultTarget) == target:
        host.noop(f"default target is {target}")
        return
    yield StringCommand("systemctl", "set-default", QuoteString(target))


@operation()
def desktop_stopped(display_managers: list[str]):
    """
    Stop and disable every display manager the host has.

    + display_managers: unit names without .service (the ones absent on the host are skipped)
    """
    units = host.get_fact(UnitFiles)
    present = [f"{dm}.service" for dm in display_managers if f"{dm}.service" in units]
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
    if not host.get_fact(Gpus):
        if host.state.is_executing or dry_run():  # once per run: without -y it also runs at prepare
            skipped("desktop GPU memory check", "no NVIDIA GPU on this host")
        host.noop("no NVIDIA GPU on this host: no desktop process can hold GPU memory")
        return
    held = [p for p in host.get_fact(GpuProcesses) if p.is_desktop]
    if not held:
        host.noop("no desktop process holds GPU memory")
        return
    yield StringCommand(QuoteString(tool), "desktop")


def apply(profile: Profile) -> None:
    if not profile.headless:
        skipped("headless", "headless is false in the profile")
        return
    default_target(name=f"Boot into {TARGET}", target=TARGET)
    desktop_stopped(
        name=f"Display managers stopped and disabled ({', '.join(profile.display_managers)})",
        display_managers=list(profile.display_managers),
    )
    gpu_free_of_desktop(name="No desktop process holds GPU memory", tool=layout.tool(profile, "glm-flash-preflight"))
