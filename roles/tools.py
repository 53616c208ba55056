"""Our host commands, installed under install_root/bin with links in /usr/local/sbin, and uv."""

import posixpath

from control import layout
from control.layout import SBIN, bin_dir
from control.profile import Profile
from roles.operations import paths
from roles.operations.python import uv_installed
from roles.operations.uploads import host_tool

TOOLS = [
    "glm-flash-patch",
    "glm-flash-launch",
    "glm-flash-preflight",
    "glm-flash-ready",
    "glm-flash-nvidia-repo",
    "glm-flash",
    "glm-flash-engine",  # engine environments: build, switch, rollback, status (roles/engines/common.py)
    "glm-flash-check-flags",  # launch flags against the engine's own parser (roles/engines/flag_check.py)
    "glm-flash-job",  # hours-long steps as transient units that survive a dropped SSH (roles/operations/job.py)
    "glm-flash-gpu-check",  # toolchain, syscalls, GPUs, NCCL under the engine unit's own properties
]


def apply(profile: Profile) -> None:
    paths.directory(profile.install_root, mode="755", name="Install root")
    paths.directory(bin_dir(profile), mode="755", name="Host tools directory")
    for tool in TOOLS:
        host_tool(tool, bin_dir(profile))
        paths.link(f"{SBIN}/{tool}", f"{bin_dir(profile)}/{tool}", name=f"Link {SBIN}/{tool}")
    # the one builder of the host's Python environments: the engines', the model downloader's
    uv = layout.host_uv(profile)
    paths.directory(posixpath.dirname(uv), mode="755", name=f"Directory {posixpath.dirname(uv)}")
    uv_installed(name=f"uv {uv} (locks/tools.txt)", dest=uv)
