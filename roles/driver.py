"""NVIDIA driver: NVIDIA's CUDA apt repository (default), or the driver a host ships with
(`preinstalled`, the GB10 box). Debian 13's own driver (550) is too old for CUDA 12.8: not a choice.

For `nvidia-repo` (docs/sources.md §7): the repository's key is trusted only when its
fingerprint is `nvidia_repo_key_fingerprint`, and `driver_branch` only when the repository
carries it; both are checked before anything is written (glm-flash-nvidia-repo). The branch
is held the way NVIDIA documents (its `nvidia-driver-pinning-<branch>` package where the
repository has one, else an apt pin), the compute-only driver set (open kernel modules when
`driver_open_modules`) is installed with DKMS and `linux-headers-amd64`, so every new kernel
gets headers and the module is built for it; driver packages are held, kernel packages only
when `hold_kernel`. Secure Boot without an enrolled DKMS key stops the host with the steps
to enroll it. With a GPU: nouveau blacklisted (initramfs rebuilt only when the blacklist
changed), persistence mode enabled (started once the driver on disk is the one loaded: before
the first reboot nouveau holds the cards), and a reboot only when a new driver or kernel is
installed but not running, the module is built for the kernel the box will boot, and
`allow_reboot`. The module is built for each kernel that has headers; one without them (from
before an upgrade) is named and skipped.

Every decision that depends on the host is made inside an operation from facts read
when it runs (roles/operations/driver.py); this role only composes them.
"""

from __future__ import annotations

from pyinfra import host

from control.report import skipped
from pyinfra_ext import memo
from roles.facts.driver import NvidiaPciDevices
from roles.operations.driver import (
    driver_at_least,
    driver_branch_pinned,
    driver_held,
    driver_installed,
    modules_built,
    nouveau_blacklisted,
    nvidia_repository,
    openpgp_tool,
    persistence_mode,
    rebooted_if_needed,
    secure_boot_ready,
)

REPO_TOOL = "glm-flash-nvidia-repo"

# Compute-only (headless) driver set of NVIDIA's Debian repository. The version comes
# from the pin on `driver_branch`, so that one value moves every package.
DRIVER_PACKAGES = {
    True: ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced"),  # open modules (Ada+)
    False: ("nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-persistenced"),  # proprietary modules
}


def gpu_present(profile) -> bool:
    """NVIDIA GPUs on the PCI bus. None with require_gpu true is an error; with it false
    (the sandbox, CI) the GPU steps are skipped and say so."""
    # Too few with require_gpu is refused at run time by roles/hardware.py, before this role.
    return bool(memo.fact(host, NvidiaPciDevices))


def apply(profile, bin_dir: str) -> None:
    gpu = gpu_present(profile)
    if profile.driver_source == "preinstalled":
        if not gpu:
            skipped("driver check (preinstalled)", "no NVIDIA GPU on this host and require_gpu is false")
            return
        driver_at_least(name=f"Driver is {profile.driver_min_version} or newer", minimum=profile.driver_min_version)
        return

    # The repository, the branch and the packages need no GPU: they run everywhere, the
    # sandbox included (against a stand-in repository). What needs the GPU follows below.
    branch = str(profile.driver_branch)
    packages = list(DRIVER_PACKAGES[bool(profile.driver_open_modules)])
    openpgp_tool(name="gpg, to check the NVIDIA key's fingerprint")
    secure_boot_ready(name="Secure Boot: DKMS's signing key enrolled")
    nvidia_repository(
        name=f"NVIDIA CUDA apt repository, key {profile.nvidia_repo_key_fingerprint[-16:]}, branch {branch}",
        tool=f"{bin_dir}/{REPO_TOOL}",
        repo_url=profile.nvidia_repo_url,
        key_url=profile.nvidia_repo_key_url,
        fingerprint=profile.nvidia_repo_key_fingerprint,
        branch=branch,
        package=packages[0],
    )
    driver_branch_pinned(name=f"Pin the driver to branch {branch}", branch=branch)
    driver_installed(name=f"Driver {branch}, DKMS and kernel headers", packages=packages, branch=branch)
    driver_held(
        name="Hold the driver packages" + (" and the kernel" if profile.hold_kernel else ""),
        branch=branch,
        hold_kernel=bool(profile.hold_kernel),
    )
    if not gpu:
        skipped(
            "nvidia module build per kernel, nouveau blacklist, persistence mode, reboot check",
            "no NVIDIA GPU on this host and require_gpu is false",
        )
        return
    modules_built(name="nvidia module built for every installed kernel")
    nouveau_blacklisted(name="Blacklist nouveau")
    persistence_mode(name="Persistence mode (nvidia-persistenced --persistence-mode)")
    rebooted_if_needed(name="Reboot if a new driver or kernel is not running", allow_reboot=profile.allow_reboot)
