"""The unprivileged user the engine runs as, and root's own state directory beside its home.

The service user's home is the engine's to write; root keeps nothing there. Root's state
(patch manifests, kept originals, markers) is in control/layout.py ROOT_STATE, root:root 0755:
the service user may read it, never write it. The host tools that write there create it
themselves if needed (and refuse it if another user could change it); this converges it.
"""

from pyinfra.operations import files, server

from control.layout import ROOT_STATE
from control.layout import service_home as state_dir
from control.profile import Profile, refuse

# video and render give access to /dev/nvidia* and /dev/dri without root.
GPU_GROUPS = ["video", "render"]


def apply(profile: Profile) -> None:
    if state_dir(profile) == ROOT_STATE:
        refuse(
            "service_user",
            f"its home would be {ROOT_STATE}, root's own state directory",
            "pick another name, such as glm-flash",
        )
    files.directory(name="Root's state directory", path=ROOT_STATE, user="root", group="root", mode="755")
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
