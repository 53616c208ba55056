"""The unprivileged user the engine runs as."""

from pyinfra.operations import files, server

from control.layout import service_home as state_dir
from control.profile import Profile

# video and render give access to /dev/nvidia* and /dev/dri without root.
GPU_GROUPS = ["video", "render"]


def apply(profile: Profile) -> None:
    server.group(name="Service group", group=profile.service_user, system=True)
    for group in GPU_GROUPS:  # udev creates them; a minimal system may lack them
        server.group(name=f"Group {group}", group=group, system=True)
    server.user(
        name="Service user",
        user=profile.service_user,
        group=profile.service_user,
        groups=GPU_GROUPS,
        system=True,
        shell="/usr/sbin/nologin",
        home=state_dir(profile),
        create_home=False,
    )
    files.directory(
        name="Service state directory",
        path=state_dir(profile),
        user=profile.service_user,
        group=profile.service_user,
        mode="750",
    )
