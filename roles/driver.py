"""NVIDIA driver: NVIDIA's CUDA apt repository (default), the driver a host ships with
(`preinstalled`, the GB10 box), or Debian's own packages (refused for CUDA 12.8+).

For `nvidia-repo` (docs/sources.md §7): repository and key from profile values (a local
mirror works), an apt pin on `driver_branch`, kernel headers for the running kernel and
DKMS, the compute-only driver set (open kernel modules when `driver_open_modules`),
nouveau blacklisted with the initramfs rebuilt only when the blacklist changed,
nvidia-persistenced enabled, apt holds on the driver and kernel packages, and a reboot
only when a new driver or kernel is installed but not running, never when
`allow_reboot` is false.

Every decision that depends on the host is made inside an operation from facts read
when it runs, so a second run yields no command; tests/unit/test_driver_ops.py feeds
the operations' inner generators with facts for each situation.
"""

from __future__ import annotations

import hashlib
import re
from io import StringIO
from urllib.parse import urlparse

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, OperationError, OperationValueError, QuoteString, StringCommand, operation
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, FileContents, Sha256File
from pyinfra.facts.server import KernelModules, Which
from pyinfra.operations import server, systemd

from roles import apt_hold
from roles.report import skipped
from roles.driver_facts import (
    Kernels,
    NvidiaLoadedModule,
    NvidiaModuleOnDisk,
    NvidiaPciDevices,
    RebootRequired,
    upstream_version,
    version_at_least,
)

KEYRING_DIR = "/etc/apt/keyrings"
SOURCES_FILE = "/etc/apt/sources.list.d/glm-flash-nvidia-cuda.sources"
PIN_FILE = "/etc/apt/preferences.d/glm-flash-nvidia-driver"
BLACKLIST_FILE = "/etc/modprobe.d/glm-flash-blacklist-nouveau.conf"
INITRAMFS_MARKER = "/var/lib/glm-flash/initramfs-nouveau.sha256"

# Compute-only (headless) driver set of NVIDIA's Debian repository. The version comes
# from the pin on `driver_branch`, so that one value moves every package.
DRIVER_PACKAGES = {
    True: ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced"),   # open modules (Ada+)
    False: ("nvidia-driver-cuda", "nvidia-kernel-dkms", "nvidia-persistenced"),       # proprietary modules
}
# Binary packages of NVIDIA's driver source packages: pinned to the branch, held once installed.
DRIVER_PACKAGE_GLOBS = ("*nvidia*", "libcuda1", "libcudadebugger1", "libnvcuvid1", "libnvoptix1", "cuda-drivers*")
DRIVER_PACKAGE_RE = re.compile(r"^(.*nvidia.*|libcuda1|libcudadebugger1|libnvcuvid1|libnvoptix1|cuda-drivers.*)$")
KERNEL_PACKAGE_RE = re.compile(r"^linux-(image|headers|modules|kbuild)-")

BLACKLIST_CONTENT = """\
# Managed by glm-flash (roles/driver.py): the NVIDIA driver needs the GPUs, not nouveau.
blacklist nouveau
options nouveau modeset=0
"""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _check_url(key: str, url: str) -> None:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https", "file") or not (parsed.netloc or parsed.scheme == "file") \
            or any(c in url for c in " \n\t'\"`$\\"):
        raise OperationValueError(f"{key}: {url!r} is not an http(s):// or file:// URL. "
                                  "Fix: set it to NVIDIA's repository or a local mirror of it")


def _in_branch(debian_version: str, branch: str) -> bool:
    return upstream_version(debian_version).split(".")[0] == branch


def _installed(packages: dict, name: str) -> list[str]:
    return sorted(packages.get(name) or ())


def _ensure_file(path: str, content: str, mode: str = "644"):
    """Yield an upload + chmod when the file's content differs; return True if it did."""
    if host.get_fact(Sha256File, path=path) == _sha256(content):
        return False
    yield FileUploadCommand(StringIO(content), path)
    yield StringCommand("chmod", mode, QuoteString(path))
    return True


def keyring_path(key_url: str) -> str:
    """The key's file name carries a hash of its URL: a new URL fetches a new key."""
    return f"{KEYRING_DIR}/glm-flash-nvidia-cuda-{_sha256(key_url)[:12]}.asc"


def sources_content(repo_url: str, key_url: str) -> str:
    # NVIDIA's CUDA repositories are flat (`Suites: /`, no components).
    return ("# Managed by glm-flash (roles/driver.py): NVIDIA's CUDA repository (nvidia_repo_url).\n"
            "Types: deb\n"
            f"URIs: {repo_url}\n"
            "Suites: /\n"
            f"Signed-By: {keyring_path(key_url)}\n")


def pin_content(branch: str) -> str:
    return ("# Managed by glm-flash (roles/driver.py): the NVIDIA driver stays on branch "
            f"{branch} (driver_branch).\n"
            f"Package: {' '.join(DRIVER_PACKAGE_GLOBS)}\n"
            f"Pin: version /^([0-9]+:)?{re.escape(branch)}\\./\n"
            "Pin-Priority: 1000\n")


# ---------------------------------------------------------------------------------
# Operations


@operation()
def nvidia_repository(repo_url: str, key_url: str):
    """NVIDIA's CUDA apt repository: its ASCII-armored key and a deb822 sources file."""
    _check_url("nvidia_repo_url", repo_url)
    _check_url("nvidia_repo_key_url", key_url)
    keyring = keyring_path(key_url)
    if not host.get_fact(File, path=keyring):
        tmp = f"{keyring}.tmp"
        yield StringCommand("install", "-d", "-m", "0755", KEYRING_DIR)
        yield StringCommand(
            "curl", "-fsSL", "--retry", "3", "-o", QuoteString(tmp), QuoteString(key_url), "&&",
            "grep", "-q", QuoteString("BEGIN PGP PUBLIC KEY BLOCK"), QuoteString(tmp), "&&",
            "chmod", "0644", QuoteString(tmp), "&&", "mv", QuoteString(tmp), QuoteString(keyring),
            "||", "{", "rm", "-f", QuoteString(tmp), ";", "echo",
            QuoteString(f"glm-flash: no ASCII-armored key at {key_url} (nvidia_repo_key_url)"), ">&2;", "false;", "}",
        )
    else:
        host.noop(f"key {keyring} is present")
    yield from _ensure_file(SOURCES_FILE, sources_content(repo_url, key_url))


@operation()
def driver_branch_pinned(branch: str):
    """apt preferences: versions of `branch` win over every other version of the driver."""
    if not re.fullmatch(r"\d{3}", str(branch)):
        raise OperationValueError(f"driver_branch: {branch!r} is not a driver branch. Fix: write it like '580'")
    yield from _ensure_file(PIN_FILE, pin_content(branch))


def _apt_install(packages, extra: str = ""):
    args = "install --no-install-recommends" + (f" {extra}" if extra else "")
    return StringCommand(noninteractive_apt(args), *[QuoteString(p) for p in packages])


@operation()
def driver_installed(packages: list[str], branch: str, kernel_release: str):
    """Kernel headers for `kernel_release` and DKMS, then `packages` at a `branch` version.

    A package missing or installed from another branch (an old driver, or a branch
    change in the profile) is (re)installed; the pin picks the version, so moving
    between branches may downgrade and may change held packages.
    """
    if not kernel_release:
        raise OperationError("driver: the running kernel release is unknown (uname -r gave nothing)")
    installed = host.get_fact(DebPackages)
    support = [f"linux-headers-{kernel_release}", "dkms"]
    missing_support = [p for p in support if not _installed(installed, p)]
    todo = []
    for name in packages:
        versions = _installed(installed, name)
        if not versions or not any(_in_branch(v, branch) for v in versions):
            todo.append(name)
    if not missing_support and not todo:
        host.noop(f"driver {branch} packages and headers for {kernel_release} are installed")
        return
    yield "apt-get update"
    if missing_support:
        # Headers first, so DKMS builds the module for the running kernel when the driver installs.
        yield _apt_install(missing_support)
    if todo:
        yield _apt_install(todo, "--allow-downgrades --allow-change-held-packages")
        # The pin only prefers the branch: if the repository does not carry it, apt
        # installs another version. Say so instead of "converging" to the wrong branch.
        yield StringCommand(
            "for p in", *[QuoteString(p) for p in todo], "; do",
            "dpkg-query -W -f='${Version}' \"$p\" | grep -Eq", QuoteString(f"^([0-9]+:)?{branch}\\."),
            "|| { echo \"glm-flash: $p is not from driver branch", branch,
            "after install; does nvidia_repo_url carry it?\" >&2; exit 1; }; done",
        )


@operation()
def dkms_module_built(kernel_release: str):
    """The nvidia module exists for the running kernel; `dkms autoinstall` builds it if not."""
    on_disk = host.get_fact(NvidiaModuleOnDisk)
    if on_disk:
        host.noop(f"nvidia {on_disk} is built for {kernel_release}")
        return
    yield StringCommand("dkms", "autoinstall", "-k", QuoteString(kernel_release))


@operation()
def nouveau_blacklisted():
    """Blacklist nouveau; rebuild the initramfs only when the blacklist changed.

    A marker holds the sha256 of the blacklist the initramfs was last built with, so a
    run that stopped between writing the file and rebuilding still rebuilds next time.
    """
    yield from _ensure_file(BLACKLIST_FILE, BLACKLIST_CONTENT)
    wanted = _sha256(BLACKLIST_CONTENT)
    marker = host.get_fact(FileContents, path=INITRAMFS_MARKER)
    if marker and marker[0].strip() == wanted:
        host.noop("initramfs was built with this blacklist")
        return
    if not host.get_fact(Which, command="update-initramfs"):
        skipped("initramfs rebuild for the nouveau blacklist",
                "update-initramfs is not installed (no kernel on this host, e.g. a container)")
        return
    yield "update-initramfs -u -k all"
    yield StringCommand("install", "-d", "-m", "0755", "/var/lib/glm-flash")
    yield StringCommand("echo", wanted, ">", INITRAMFS_MARKER)


@operation()
def persistence_mode():
    """nvidia-persistenced enabled and running: the driver stays initialised between jobs."""
    yield from systemd.service._inner(service="nvidia-persistenced.service", running=True, enabled=True)


def hold_candidates(installed: dict, branch: str) -> list[str]:
    """Installed driver packages of `branch` and every installed kernel package."""
    names = []
    for name, versions in sorted(installed.items()):
        if KERNEL_PACKAGE_RE.match(name):
            names.append(name)
        elif DRIVER_PACKAGE_RE.match(name) and any(_in_branch(v, branch) for v in versions):
            names.append(name)
    return names


@operation()
def driver_and_kernel_held(branch: str):
    """apt holds on the installed driver (branch) and kernel packages (read when run)."""
    names = hold_candidates(host.get_fact(DebPackages), branch)
    if not names:
        host.noop("no driver or kernel packages installed to hold")
        return
    yield from apt_hold.held._inner(packages=names)


def reboot_reasons() -> list[str]:
    """Why the running system is not the installed one; empty when it is."""
    reasons = []
    kernels = host.get_fact(Kernels)
    if kernels.newer_installed:
        reasons.append(f"kernel {kernels.newer_installed} is installed, {kernels.running} is running")
    loaded = host.get_fact(NvidiaLoadedModule)
    on_disk = host.get_fact(NvidiaModuleOnDisk)
    if on_disk and loaded and loaded.version != on_disk:
        reasons.append(f"driver {on_disk} is installed, {loaded.version} is loaded")
    elif on_disk and not loaded:
        reasons.append(f"driver {on_disk} is installed but not loaded")
    if on_disk and "nouveau" in (host.get_fact(KernelModules) or {}):
        reasons.append("nouveau is loaded and holds the GPUs")
    flag = host.get_fact(RebootRequired)
    if flag.required:
        pkgs = f" by {', '.join(flag.packages)}" if flag.packages else ""
        reasons.append(f"/run/reboot-required was set{pkgs}")
    return reasons


@operation(is_idempotent=False, idempotent_notice="reboots only while the running system differs from the installed one")
def rebooted_if_needed(allow_reboot: bool):
    """Reboot when a new driver or kernel is installed but not running; with
    `allow_reboot` false only say that a reboot is pending and why."""
    reasons = reboot_reasons()
    if not reasons:
        host.noop("running kernel and driver are the installed ones")
        return
    why = "; ".join(reasons)
    if not allow_reboot:
        logger.warning(f"{host.name}: reboot pending (allow_reboot is false, not rebooting): {why}")
        host.noop(f"reboot pending: {why}")
        return
    logger.warning(f"{host.name}: rebooting: {why}")
    yield from server.reboot._inner(delay=10, interval=5, reboot_timeout=900)


@operation()
def driver_at_least(minimum: str):
    """The driver a host ships with (GB10: DGX OS) is `minimum` or newer."""
    loaded = host.get_fact(NvidiaLoadedModule)
    version = loaded.version if loaded else host.get_fact(NvidiaModuleOnDisk)
    if not version:
        raise OperationError(f"{host.name}: driver_source: 'preinstalled' but no NVIDIA driver is loaded or "
                             "installed. Fix: install the vendor's driver (DGX OS ships it), or use driver_source: 'nvidia-repo'")
    if not version_at_least(version, minimum):
        raise OperationError(f"{host.name}: driver_min_version: the installed driver {version} is older than {minimum}. "
                             "Fix: update the driver with the vendor's tools (DGX OS: its system update), "
                             "then deploy again")
    host.noop(f"driver {version} >= {minimum}")
    yield from ()  # a check: never a command


# ---------------------------------------------------------------------------------
# The role


def _refuse_debian(profile) -> None:
    """Debian's driver is refused by the profile's cross-check (one source of truth);
    re-run it here so a Profile that did not come through profile.build() is refused too."""
    from roles import profile as profile_mod
    try:
        profile_mod.build(profile.host, profile.as_dict(), api_key_present=True)
    except profile_mod.ProfileError as e:
        problems = [p for p in e.problems if p.key == "driver_source"]
        if problems:
            profile_mod.fail(profile_mod.ProfileError(problems))
    profile_mod.fail(profile_mod.ProfileError([profile_mod.Problem(
        profile.host, "driver_source", "'debian' is not supported by this deploy",
        "use driver_source: 'nvidia-repo'")]))


def gpu_present(profile) -> bool:
    """NVIDIA GPUs on the PCI bus. None with require_gpu true is an error; with it false
    (the sandbox, CI) the GPU steps are skipped and say so."""
    devices = host.get_fact(NvidiaPciDevices)
    if profile.require_gpu and len(devices) < profile.gpu_count:
        raise OperationError(
            f"{host.name}: gpu_count: the profile expects {profile.gpu_count} NVIDIA GPU(s), the PCI bus shows "
            f"{len(devices)}. Fix: check the hardware, or set gpu_count (require_gpu: false for a test box)")
    return bool(devices)


def apply(profile) -> None:
    if profile.driver_source == "debian":
        _refuse_debian(profile)
    if not gpu_present(profile):
        skipped(f"NVIDIA driver ({profile.driver_source}): repository, pin, headers, DKMS, driver, "
                "nouveau blacklist, persistence mode, holds, reboot check",
                "no NVIDIA GPU on this host and require_gpu is false")
        return
    if profile.driver_source == "preinstalled":
        driver_at_least(name=f"Driver is {profile.driver_min_version} or newer", minimum=profile.driver_min_version)
        return

    kernel = host.get_fact(Kernels).running
    branch = str(profile.driver_branch)
    nvidia_repository(name="NVIDIA CUDA apt repository", repo_url=profile.nvidia_repo_url,
                      key_url=profile.nvidia_repo_key_url)
    driver_branch_pinned(name=f"Pin the driver to branch {branch}", branch=branch)
    driver_installed(name=f"Driver {branch} with headers for {kernel}",
                     packages=list(DRIVER_PACKAGES[bool(profile.driver_open_modules)]),
                     branch=branch, kernel_release=kernel)
    dkms_module_built(name="nvidia module built for the running kernel", kernel_release=kernel)
    nouveau_blacklisted(name="Blacklist nouveau")
    persistence_mode(name="Persistence mode (nvidia-persistenced)")
    driver_and_kernel_held(name="Hold driver and kernel packages", branch=branch)
    rebooted_if_needed(name="Reboot if a new driver or kernel is not running", allow_reboot=profile.allow_reboot)
