"""No desktop on a serving node: it held 0.5-0.7 GiB on GPU 0 in the field.

Three states, each an operation that reads the host when it runs: the default target is
multi-user, no display manager runs or starts at boot, and no desktop process holds GPU memory.
"""

from control import layout
from control.profile import Profile
from control.report import skipped
from roles.operations.headless import default_target, desktop_stopped, gpu_free_of_desktop

TARGET = "multi-user.target"


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
