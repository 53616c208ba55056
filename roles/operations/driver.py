"""Operations of the NVIDIA driver role (roles/driver.py).

Every decision that depends on the host is made inside an operation from facts read
when it runs, so a second run yields no command; tests/unit/test_driver_ops.py feeds
the operations' inner generators with facts for each situation.
"""

from __future__ import annotations

import hashlib
import re
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents, Sha256File
from pyinfra.facts.server import KernelModules, Which
from pyinfra.operations import server, systemd

from control.layout import INITRAMFS_MARKER, ROOT_STATE
from control.report import skipped
from pyinfra_ext import memo
from pyinfra_ext.refusal import refusing
from roles.facts import flags
from roles.facts.apt import AptHeldPackages
from roles.facts.driver import (
    AptVersions,
    KernelHeaders,
    Kernels,
    NvidiaLoadedModule,
    NvidiaModuleFor,
    NvidiaModuleOnDisk,
    NvidiaRepoState,
    RebootRequired,
    SecureBoot,
    upstream_version,
    version_at_least,
)
from roles.operations import apt_hold, paths
from roles.operations.packages import UPDATE as APT_UPDATE
from roles.operations.packages import apt_install

KEYRING = "/etc/apt/keyrings/glm-flash-nvidia-cuda.gpg"
SOURCES_FILE = "/etc/apt/sources.list.d/glm-flash-nvidia-cuda.sources"
PIN_FILE = "/etc/apt/preferences.d/glm-flash-nvidia-driver"
BLACKLIST_FILE = "/etc/modprobe.d/glm-flash-blacklist-nouveau.conf"
PERSISTENCED_DROPIN = "/etc/systemd/system/nvidia-persistenced.service.d/glm-flash.conf"
DKMS_MOK = "/var/lib/dkms/mok.pub"

# Binary packages of NVIDIA's driver source packages: pinned to the branch, held once installed.
DRIVER_PACKAGE_GLOBS = ("*nvidia*", "libcuda1", "libcudadebugger1", "libnvcuvid1", "libnvoptix1", "cuda-drivers*")
DRIVER_PACKAGE_RE = re.compile(r"^(.*nvidia.*|libcuda1|libcudadebugger1|libnvcuvid1|libnvoptix1|cuda-drivers.*)$")
KERNEL_PACKAGE_RE = re.compile(r"^linux-(image|headers|modules|kbuild)-")

# NVIDIA's Ansible role runs the daemon with persistence mode on (docs/sources.md §7).
PERSISTENCED_CONTENT = """\
# Managed by glm-flash (roles/driver.py): keep the GPUs initialised between jobs.
[Service]
ExecStart=
ExecStart=/usr/bin/nvidia-persistenced --persistence-mode --verbose
"""

BLACKLIST_CONTENT = """\
# Managed by glm-flash (roles/driver.py): the NVIDIA driver needs the GPUs, not nouveau.
blacklist nouveau
options nouveau modeset=0
"""


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _of_branch(versions, branch: str) -> bool:
    """One of the Debian `versions` (None: not installed) belongs to driver `branch`."""
    return any(upstream_version(v).split(".")[0] == branch for v in versions or ())


def _ensure_file(path: str, content: str, mode: str = "644"):
    """Yield the commands that write the file whole (roles/operations/paths.py) when its content
    differs; return True if it did."""
    if memo.fact(host, Sha256File, path=path) == _sha256(content):
        return False
    yield from paths.replaced_whole(StringIO(content), path, user="root", group="root", mode=mode)
    return True


def pin_content(branch: str) -> str:
    return (
        "# Managed by glm-flash (roles/driver.py): the NVIDIA driver stays on branch "
        f"{branch} (driver_branch).\n"
        f"Package: {' '.join(DRIVER_PACKAGE_GLOBS)}\n"
        f"Pin: version /^([0-9]+:)?{re.escape(branch)}\\./\n"
        "Pin-Priority: 1000\n"
    )


@operation()
def openpgp_tool():
    """gpg on the host: it reads the fingerprint of the key before apt ever uses it."""
    if memo.fact(host, DebPackages).get("gpg"):
        host.noop("gpg is installed")
        return
    yield APT_UPDATE
    yield apt_install(["gpg"])


@operation()
def nvidia_repository(tool: str, repo_url: str, key_url: str, fingerprint: str, branch: str, package: str):
    """
    NVIDIA's CUDA apt repository trusted through exactly one key, `fingerprint`.

    Converged when the keyring holds that key alone, the sources file is current and
    `package` of `branch` is installed. Otherwise glm-flash-nvidia-repo checks the key and
    the branch on a throwaway apt state and writes nothing when either is wrong.

    + tool: glm-flash-nvidia-repo on the host
    + repo_url: the repository's URL (nvidia_repo_url)
    + key_url: where its signing key is fetched from
    + fingerprint: the one key fingerprint trusted for it
    + branch: the driver branch the repository must carry (three digits, like 590)
    + package: the package of that branch that must be installed
    """
    state = memo.fact(host, NvidiaRepoState, tool=tool, repo=repo_url, keyring=KEYRING, sources=SOURCES_FILE)
    trusted = state is not None and state["fingerprints"] == [fingerprint.upper()] and state["sources_current"]
    installed = _of_branch(memo.fact(host, DebPackages).get(package), branch)
    if trusted and installed:
        host.noop(f"{repo_url} trusted through {fingerprint}; {package} {branch} installed")
        return
    options = flags(repo=repo_url, key_url=key_url, fingerprint=fingerprint, branch=branch, package=package)
    yield StringCommand(QuoteString(tool), "setup", *options, *flags(keyring=KEYRING, sources=SOURCES_FILE))


@operation()
def driver_branch_pinned(branch: str):
    """
    The branch held the way NVIDIA documents: its `nvidia-driver-pinning-<branch>`
    package where the repository has one, else apt preferences on the branch's versions.

    + branch: the driver branch (three digits, like 590: the profile's driver_branch, checked there)
    """
    pinning = f"nvidia-driver-pinning-{branch}"
    if memo.fact(host, AptVersions, package=pinning):
        if not memo.fact(host, DebPackages).get(pinning):
            yield apt_install([pinning])
        else:
            host.noop(f"{pinning} is installed")
        if memo.fact(host, Sha256File, path=PIN_FILE):
            yield StringCommand("rm", "-f", PIN_FILE)
        return
    yield from _ensure_file(PIN_FILE, pin_content(branch))


@operation()
def driver_installed(packages: list[str], branch: str):
    """
    DKMS and kernel headers, then `packages` at a `branch` version.

    `linux-headers-amd64` follows every new kernel, so DKMS builds the module for it at
    install; the running kernel's own headers too when it is this system's (not a
    container's host kernel) and the archive still has them. Debian keeps only the current
    kernel ABI's headers: when the running kernel's are gone and no newer kernel is installed,
    the current image comes with its headers (`linux-image-amd64`), the module is built for
    it, and the reboot step boots it. A package missing or from another branch is
    (re)installed; the pin picks the version, so moving between branches may downgrade held
    packages.

    + packages: the driver's packages (open or proprietary kernel modules)
    + branch: the driver branch their versions must belong to
    """
    kernels = memo.fact(host, Kernels)
    installed = memo.fact(host, DebPackages)
    support = ["linux-headers-amd64", "dkms"]
    if kernels.running in kernels.installed:
        own = f"linux-headers-{kernels.running}"
        if installed.get(own) or memo.fact(host, AptVersions, package=own):
            support.append(own)
        elif not kernels.newer_installed:
            logger.warning(
                f"{host.name}: {own} is not in the archive any more (it keeps the current kernel's only): "
                "installing the current kernel with its headers; the module is built for it and the box "
                "boots it at the reboot step"
            )
            support.insert(0, "linux-image-amd64")
    missing_support = [p for p in support if not installed.get(p) or p == "linux-image-amd64"]
    todo = [name for name in packages if not _of_branch(installed.get(name), branch)]
    if not missing_support and not todo:
        host.noop(f"driver {branch} packages, DKMS and kernel headers are installed")
        return
    yield APT_UPDATE
    if missing_support:
        # Headers first, so DKMS builds the module for the kernels when the driver installs.
        yield apt_install(missing_support)
    if todo:
        yield apt_install(todo, "--allow-downgrades --allow-change-held-packages")
        # The pin only prefers the branch: if the repository does not carry it, apt
        # installs another version. Say so instead of "converging" to the wrong branch.
        yield StringCommand(
            "for p in",
            *[QuoteString(p) for p in todo],
            "; do",
            "dpkg-query -W -f='${Version}' \"$p\" | grep -Eq",
            QuoteString(f"^([0-9]+:)?{branch}\\."),
            "|| { echo \"glm-flash: $p is not from driver branch",
            branch,
            "after install; does nvidia_repo_url carry it?\" >&2; exit 1; }; done",
        )


@operation()
def modules_built():
    """The nvidia module exists for every installed kernel whose headers are installed;
    `dkms autoinstall` builds it where not. A kernel without headers (one from before an
    upgrade: `linux-headers-amd64` follows the newest only) is skipped and named, since dkms
    fails on it ("Your kernel headers for kernel ... cannot be found", dkms#484). The reboot
    step never boots a kernel the module is not built for."""
    kernels = memo.fact(host, Kernels)
    if not kernels.installed:
        skipped("nvidia module for each installed kernel", "no kernel is installed here (a container)")
        return
    headers = memo.fact(host, KernelHeaders)
    missing = [k for k in kernels.installed if not memo.fact(host, NvidiaModuleFor, kernel=k)]
    headless = [k for k in missing if k not in headers]
    if headless:
        skipped(
            f"nvidia module for kernel {', '.join(headless)}",
            "its headers are not installed (no /lib/modules/<kernel>/build), so DKMS cannot build for it; "
            "remove that kernel's image or install its headers if the box should boot it",
        )
    build = [k for k in missing if k in headers]
    if not build:
        host.noop(
            f"nvidia module built for {', '.join(k for k in kernels.installed if k not in headless) or 'no kernel'}"
        )
        return
    for kernel in build:
        yield StringCommand("dkms", "autoinstall", "-k", QuoteString(kernel))


@operation()
def secure_boot_ready():
    """With Secure Boot on, DKMS signs the module with its key, which the firmware must know:
    without it enrolled the driver cannot load, so the host stops with the steps to enroll it
    (Debian's and NVIDIA's documented DKMS flow)."""
    kernels = memo.fact(host, Kernels)
    if kernels.running not in kernels.installed:
        host.noop("Secure Boot: not this system's kernel (a container); nothing to check")
        return
    state = memo.fact(host, SecureBoot, mok=DKMS_MOK)
    if not state.enabled:
        host.noop("Secure Boot is off")
        return
    if state.enrolled:
        host.noop(f"Secure Boot is on and DKMS's key {DKMS_MOK} is enrolled")
        return
    if not all(memo.fact(host, DebPackages).get(p) for p in ("dkms", "mokutil")):
        yield APT_UPDATE
        yield apt_install(["dkms", "mokutil"])
    if not state.key_exists:
        yield StringCommand("dkms", "generate_mok")
    # The fact may have run before mokutil was there: ask it again, then stop only if still not enrolled.
    message = (
        f"glm-flash: Secure Boot is on and DKMS's signing key {DKMS_MOK} is not enrolled, so the nvidia "
        f"module could not load. Fix: run `mokutil --import {DKMS_MOK}` on the host (it asks for a one-time "
        "password), reboot, choose Enroll MOK on the console with that password, then deploy again"
    )
    enrolled = StringCommand("mokutil --test-key", DKMS_MOK, "2>&1 | grep -q", QuoteString("is already enrolled"))
    yield StringCommand(enrolled, "|| { echo", QuoteString(message), ">&2; exit 1; }")


def boot_kernel_lacks_module() -> str | None:
    """The kernel a reboot would start (the newest installed), when the nvidia module is
    not built for it."""
    newest = memo.fact(host, Kernels).newest
    if newest and not memo.fact(host, NvidiaModuleFor, kernel=newest):
        return newest
    return None


@operation()
def nouveau_blacklisted():
    """Blacklist nouveau; rebuild the initramfs only when the blacklist changed.

    A marker holds the sha256 of the blacklist the initramfs was last built with, so a
    run that stopped between writing the file and rebuilding still rebuilds next time.
    """
    yield from _ensure_file(BLACKLIST_FILE, BLACKLIST_CONTENT)
    wanted = _sha256(BLACKLIST_CONTENT)
    marker = memo.fact(host, FileContents, path=INITRAMFS_MARKER)
    if marker and marker[0].strip() == wanted:
        host.noop("initramfs was built with this blacklist")
        return
    if not memo.fact(host, Which, command="update-initramfs"):
        skipped(
            "initramfs rebuild for the nouveau blacklist",
            "update-initramfs is not installed (no kernel on this host, e.g. a container)",
        )
        return
    yield "update-initramfs -u -k all"
    # In root's own directory: the old marker in the service user's home is not trusted (a
    # host that had one rebuilds once more).
    yield StringCommand("install", "-d", "-m", "0755", "-o", "root", "-g", "root", ROOT_STATE)
    yield StringCommand("echo", wanted, ">", INITRAMFS_MARKER)


def driver_running() -> str | None:
    """Why the nvidia module that runs is not the one on disk (None when it is): until the
    reboot that loads it, nouveau or an older driver holds the cards."""
    loaded = memo.fact(host, NvidiaLoadedModule)
    on_disk = memo.fact(host, NvidiaModuleOnDisk)
    if on_disk and loaded and loaded.version == on_disk:
        return None
    if not on_disk:
        return "no nvidia module is built for the running kernel"
    if not loaded:
        held = " (nouveau holds the GPUs)" if "nouveau" in (memo.fact(host, KernelModules) or {}) else ""
        return f"driver {on_disk} is installed but not loaded{held}"
    return f"driver {on_disk} is installed, {loaded.version} is loaded"


@operation()
def persistence_mode():
    """nvidia-persistenced with --persistence-mode, enabled; started (restarted for a new
    drop-in) only while the loaded nvidia module is the one on disk. Before the reboot that
    loads it the daemon cannot open the devices and exits, which would stop the run before its
    own reboot: then it is only enabled and the boot starts it, as NVIDIA's Ansible role does
    (enable, then reboot)."""
    not_yet = driver_running()
    changed = yield from _ensure_file(PERSISTENCED_DROPIN, PERSISTENCED_CONTENT)
    if changed:
        yield "systemctl daemon-reload"
    if not_yet:
        logger.warning(f"{host.name}: nvidia-persistenced enabled, not started until the reboot: {not_yet}")
        yield from systemd.service._inner(service="nvidia-persistenced.service", running=None, enabled=True)
        return
    yield from systemd.service._inner(
        service="nvidia-persistenced.service", running=True, enabled=True, restarted=changed
    )


def hold_candidates(installed: dict, branch: str, hold_kernel: bool) -> list[str]:
    """Installed driver packages of `branch`, and the installed kernel packages when `hold_kernel`."""
    names = []
    for name, versions in sorted(installed.items()):
        if KERNEL_PACKAGE_RE.match(name):
            if hold_kernel:
                names.append(name)
        elif DRIVER_PACKAGE_RE.match(name) and _of_branch(versions, branch):
            names.append(name)
    return names


@operation()
def driver_held(branch: str, hold_kernel: bool):
    """
    apt holds on the installed driver packages (and kernel packages when `hold_kernel`),
    read when run; kernel holds a profile no longer wants are released.

    + branch: the driver branch whose packages are held
    + hold_kernel: hold the kernel's packages too (else their holds are released)
    """
    installed = memo.fact(host, DebPackages)
    names = hold_candidates(installed, branch, hold_kernel)
    if not hold_kernel:
        held = set(memo.fact(host, AptHeldPackages))
        stale = sorted(n for n in installed if KERNEL_PACKAGE_RE.match(n) and n in held)
        if stale:
            yield from apt_hold.held._inner(packages=stale, present=False)
    if not names:
        host.noop("no driver packages installed to hold")
        return
    yield from apt_hold.held._inner(packages=names)


def reboot_reasons() -> list[str]:
    """Why the running system is not the installed one; empty when it is."""
    reasons = []
    kernels = memo.fact(host, Kernels)
    if kernels.newer_installed:
        reasons.append(f"kernel {kernels.newer_installed} is installed, {kernels.running} is running")
    loaded = memo.fact(host, NvidiaLoadedModule)
    on_disk = memo.fact(host, NvidiaModuleOnDisk)
    if on_disk and loaded and loaded.version != on_disk:
        reasons.append(f"driver {on_disk} is installed, {loaded.version} is loaded")
    elif on_disk and not loaded:
        reasons.append(f"driver {on_disk} is installed but not loaded")
    if on_disk and "nouveau" in (memo.fact(host, KernelModules) or {}):
        reasons.append("nouveau is loaded and holds the GPUs")
    flag = memo.fact(host, RebootRequired)
    if flag.required:
        pkgs = f" by {', '.join(flag.packages)}" if flag.packages else ""
        reasons.append(f"/run/reboot-required was set{pkgs}")
    return reasons


@operation(
    is_idempotent=False, idempotent_notice="reboots only while the running system differs from the installed one"
)
def rebooted_if_needed(allow_reboot: bool):
    """
    Reboot when a new driver or kernel is installed but not running; never into a kernel the
    nvidia module is not built for.

    + allow_reboot: reboot (true), or only say that a reboot is pending and why (false)
    """
    reasons = reboot_reasons()
    if not reasons:
        host.noop("running kernel and driver are the installed ones")
        return
    why = "; ".join(reasons)
    lacking = boot_kernel_lacks_module()
    if lacking:
        logger.warning(
            f"{host.name}: reboot pending but not rebooting: the nvidia module is not built for kernel "
            f"{lacking}, which the box would boot (see `dkms status`; are its headers installed?): {why}"
        )
        host.noop(f"reboot pending, refused: no nvidia module for {lacking}")
        return
    if not allow_reboot:
        logger.warning(f"{host.name}: reboot pending (allow_reboot is false, not rebooting): {why}")
        host.noop(f"reboot pending: {why}")
        return
    logger.warning(f"{host.name}: rebooting: {why}")
    yield from server.reboot._inner(delay=10, interval=5, reboot_timeout=900)


@operation()
@refusing  # a driver too old fails this host only
def driver_at_least(minimum: str):
    """
    The driver a host ships with (GB10: DGX OS) is `minimum` or newer: a check, never a command.

    + minimum: the oldest driver version accepted (driver_min_version)
    """
    loaded = memo.fact(host, NvidiaLoadedModule)
    version = loaded.version if loaded else memo.fact(host, NvidiaModuleOnDisk)
    if not version:
        raise OperationError(
            f"{host.name}: driver_source: 'preinstalled' but no NVIDIA driver is loaded or "
            "installed. Fix: install the vendor's driver (DGX OS ships it), or use driver_source: 'nvidia-repo'"
        )
    if not version_at_least(version, minimum):
        raise OperationError(
            f"{host.name}: driver_min_version: the installed driver {version} is older than {minimum}. "
            "Fix: update the driver with the vendor's tools (DGX OS: its system update), "
            "then deploy again"
        )
    host.noop(f"driver {version} >= {minimum}")
    yield from ()  # a check: never a command
