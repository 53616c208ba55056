"""Our host commands, installed under install_root/bin with links in /usr/local/sbin."""

from pyinfra.operations import files

from roles.ops import host_tool
from roles.profile import Profile

TOOLS = ["glm-flash-patch", "glm-flash-launch", "glm-flash-preflight", "glm-flash-ready", "glm-flash-nvidia-repo", "glm-flash"]


def bin_dir(profile: Profile) -> str:
    return f"{profile.install_root}/bin"


def apply(profile: Profile) -> None:
    files.directory(name="Install root", path=profile.install_root, mode="755")
    files.directory(name="Host tools directory", path=bin_dir(profile), mode="755")
    for tool in TOOLS:
        host_tool(tool, bin_dir(profile))
        files.link(name=f"Link /usr/local/sbin/{tool}", path=f"/usr/local/sbin/{tool}",
                   target=f"{bin_dir(profile)}/{tool}")
