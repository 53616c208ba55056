"""The unprivileged user the engine runs as, and root's own state directory beside its home.

The service user's home is the engine's to write; root keeps nothing there. Root's state
(patch manifests, kept originals, markers) is in control/layout.py ROOT_STATE, root:root 0755:
the service user may read it, never write it. The host tools that write there create it
themselves if needed (and refuse it if another user could change it); this converges it.
"""

from control.layout import ROOT_STATE
from control.layout import service_home as state_dir
from control.profile import Profile, refuse
from roles.operations import accounts, paths

# video and render give access to /dev/nvidia* and /dev/dri without root.
GPU_GROUPS = ["video", "render"]


def apply(profile: Profile) -> None:
    if state_dir(profile) == ROOT_STATE:
        refuse(
            "service_user",
            f"its home would be {ROOT_STATE}, root's own state directory",
            "pick another name, such as glm-flash",
        )
    paths.directory(ROOT_STATE, user="root", group="root", mode="755", name="Root's state directory")
    accounts.group(profile.service_user, "Service group")
    for group in GPU_GROUPS:  # udev creates them; a minimal system may lack them
        accounts.group(group, f"Group {group}")
    accounts.user(
        profile.service_user,
        group=profile.service_user,
        groups=GPU_GROUPS,
        home=state_dir(profile),
        shell="/usr/sbin/nologin",
        op_name="Service user",
    )
    paths.directory(
        state_dir(profile),
        user=profile.service_user,
        group=profile.service_user,
        mode="750",
        name="Service state directory",
    )
