"""No desktop on a serving node: it held 0.5-0.7 GiB on GPU 0 in the field."""

from pyinfra import host
from pyinfra.operations import server, systemd

from control.profile import Profile
from control.report import skipped
from roles.facts.system import DefaultTarget, GpuProcesses, Gpus, UnitFiles

TARGET = "multi-user.target"


def apply(profile: Profile, bin_dir: str) -> None:
    if not profile.headless:
        skipped("headless", "headless is false in the profile")
        return
    if host.get_fact(DefaultTarget) != TARGET:
        server.shell(name=f"Boot into {TARGET}", commands=[f"systemctl set-default {TARGET}"])
    units = host.get_fact(UnitFiles)
    for dm in profile.display_managers:
        if f"{dm}.service" in units:
            systemd.service(name=f"Stop and disable {dm}", service=f"{dm}.service", running=False, enabled=False)
    if not host.get_fact(Gpus):
        skipped("desktop GPU memory check", "no NVIDIA GPU on this host")
        return
    held = [p for p in host.get_fact(GpuProcesses) if p.is_desktop]
    if held:
        names = ", ".join(f"{p.name} (pid {p.pid}, {p.used_mib} MiB)" for p in held)
        server.shell(
            name=f"No desktop process holds GPU memory (now: {names})",
            commands=[f"{bin_dir}/glm-flash-preflight desktop"],
        )
