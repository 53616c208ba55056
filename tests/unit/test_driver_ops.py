"""Driver role, command level: given the facts of a host in each situation, the exact
commands the operations yield (their `_inner` generators on a fake host).

Simulated: a GPU and NVIDIA's servers are not available here, so the facts a GPU host
would report (PCI devices, loaded module, installed packages, kernels, Secure Boot) are
given by each test. What can run for real does so elsewhere: the repository, key and
branch checks, the pinning package and the runfile against a stand-in repository in
tests/sandbox/test_nvidia_sources.py; apt holds and the pin in tests/sandbox/test_apt_hold_rootfs.py.
"""

import json

import fakehost
import pytest
from fakehost import F, FakeHost, Recorder, commands, on, refusal
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents, Sha256File
from pyinfra.facts.server import KernelModules, Which
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from control.profile import build
from roles import driver
from roles.facts.apt import AptHeldPackages
from roles.facts.driver import (
    AptVersions,
    KernelHeaders,
    Kernels,
    KernelState,
    LoadedModule,
    NvidiaLoadedModule,
    NvidiaModuleFor,
    NvidiaModuleOnDisk,
    NvidiaPciDevices,
    NvidiaRepoState,
    PciDevice,
    RebootFlag,
    RebootRequired,
    SecureBoot,
    SecureBootState,
)
from roles.operations import apt_hold, packages
from roles.operations import driver as driver_ops
from roles.operations.packages import retried_while_locked


def locked(mark: str) -> str:
    """apt-mark retried while dpkg's lock is held (roles/operations/packages.py)."""
    return retried_while_locked(mark)


RUNNING = "6.12.38+deb13-amd64"
NEWER = "6.12.41+deb13-amd64"
REPO = "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/"
KEY = REPO + "8793F200.pub"
FPR = "02182E60104FCDC26EAE1B8597A5D4CB8793F200"
MIRROR = "http://mirror.lan/nvidia/debian13/x86_64/"
TOOL = "/opt/glm-flash/bin/glm-flash-nvidia-repo"
INSTALL = (
    'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
    '-o Dpkg::Options::="--force-confold" -o DPkg::Lock::Timeout=600 install --no-install-recommends'
)
UPDATE = packages.UPDATE  # apt-get update retried while its lock is held (test_apt_safety.py)


def whole(path: str, content: str) -> list[str]:
    """The commands that write one of the driver's files whole (roles/operations/paths.py)."""
    d, tmp = path.rsplit("/", 1)[0], f"{path.rsplit('/', 1)[0]}/.{path.rsplit('/', 1)[1]}.glm-flash-new"
    return [
        f"mkdir -p {d}",
        f"rm -f {tmp}",
        f"upload {tmp}\n{content}",
        f"chown root:root {tmp}",
        f"chmod 644 {tmp}",
        f"sync {tmp} && mv -f -T {tmp} {path} && sync {d}",
    ]


OPEN = ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced"]
L40S = [PciDevice("0000:01:00.0", "0x26b9", "0x030200"), PciDevice("0000:41:00.0", "0x26b9", "0x030200")]
SETUP = (
    f"{TOOL} setup --repo {REPO} --key-url {KEY} --fingerprint {FPR} --branch 590 --package nvidia-driver-cuda "
    f"--keyring {driver_ops.KEYRING} --sources {driver_ops.SOURCES_FILE}"
)
PINNING = "nvidia-driver-pinning-590"


def sha(text):
    return driver_ops._sha256(text)


def kernel_packages(*releases):
    pkgs = {"linux-image-amd64": {"6.12.38-1"}}  # a bare install: no headers yet
    for r in releases:
        pkgs[f"linux-image-{r}"] = {"6.12.38-1"}
    return pkgs


def driver_packages(version):
    return {
        "nvidia-driver-cuda": {version},
        "nvidia-kernel-open-dkms": {version},
        "nvidia-persistenced": {version},
        "libcuda1": {version},
        "nvidia-container-toolkit": {"1.17.8-1"},
    }


def repo_state(fingerprints=(FPR,), sources_current=True):
    return {"fingerprints": list(fingerprints), "sources_current": sources_current}


def fresh_host(over=None):
    """Debian 13 after install: kernel only, nothing of ours. The repository carries
    NVIDIA's pinning package for 590 (seen by apt once the repository is configured)."""
    facts = {
        NvidiaPciDevices: L40S,
        Kernels: KernelState(RUNNING, (RUNNING,)),
        DebPackages: kernel_packages(RUNNING),
        NvidiaRepoState: None,
        AptVersions: [],
        F(AptVersions, package=PINNING): ["590.48.01-1"],
        F(AptVersions, package=f"linux-headers-{RUNNING}"): ["6.12.38-1"],  # the archive's current ABI
        # as the module step sees it, after the headers' install earlier in the run
        KernelHeaders: frozenset({RUNNING}),
        SecureBoot: SecureBootState(False, False, False),
        NvidiaModuleFor: None,
        F(Sha256File, path=driver_ops.SOURCES_FILE): None,
        F(Sha256File, path=driver_ops.PIN_FILE): None,
        F(Sha256File, path=driver_ops.PERSISTENCED_DROPIN): None,
        F(Sha256File, path=driver_ops.BLACKLIST_FILE): None,
        F(FileContents, path=driver_ops.INITRAMFS_MARKER): None,
        F(Which, command="update-initramfs"): "/usr/sbin/update-initramfs",
        SystemdStatus: {},
        SystemdEnabled: {},
        AptHeldPackages: [],
        NvidiaLoadedModule: None,
        NvidiaModuleOnDisk: None,
        KernelModules: {"nouveau": {}},
        RebootRequired: RebootFlag(False, ()),
    }
    facts.update(over or {})
    return facts


def installed_packages(driver_version: str) -> dict:
    """The packages of a host this role provisioned, with the driver at driver_version."""
    return {
        **kernel_packages(RUNNING),
        f"linux-headers-{RUNNING}": {"6.12.38-1"},
        "dkms": {"3.2.2-1"},
        "linux-headers-amd64": {"6.12.38-1"},
        "gpg": {"2.4.7-21"},
        PINNING: {"590.48.01-1"},
        **driver_packages(driver_version),
    }


def current_host(over=None):
    """Everything this role does is done and running: driver 590.48.01 loaded."""
    pkgs = installed_packages("590.48.01-1")
    facts = fresh_host()
    facts.update(
        {
            DebPackages: pkgs,
            NvidiaRepoState: repo_state(),
            NvidiaModuleFor: "590.48.01",
            F(Sha256File, path=driver_ops.BLACKLIST_FILE): sha(driver_ops.BLACKLIST_CONTENT),
            F(Sha256File, path=driver_ops.PERSISTENCED_DROPIN): sha(driver_ops.PERSISTENCED_CONTENT),
            F(FileContents, path=driver_ops.INITRAMFS_MARKER): [sha(driver_ops.BLACKLIST_CONTENT)],
            SystemdStatus: {"nvidia-persistenced.service": True},
            SystemdEnabled: {"nvidia-persistenced.service": True},
            AptHeldPackages: sorted(driver_ops.hold_candidates(pkgs, "590", False)),
            NvidiaLoadedModule: LoadedModule("590.48.01", True),
            NvidiaModuleOnDisk: "590.48.01",
            KernelModules: {"nvidia": {}, "nvidia_uvm": {}},
        }
    )
    facts.update(over or {})
    return facts


def profile(**data):
    return build("node1", data, api_key_present=False)


def simulate(monkeypatch, facts, prof):
    """Run driver.apply(prof) with every operation replaced by a recorder of its commands."""
    fake = FakeHost(facts)
    rec = Recorder(fake)
    rec.patch(monkeypatch, driver, apt_hold)
    with on(fake):
        driver.apply(prof, "/opt/glm-flash/bin")
    return rec


FRESH_COMMANDS = [
    UPDATE,
    f"{INSTALL} gpg",
    SETUP,
    f"{INSTALL} {PINNING}",
    UPDATE,
    f"{INSTALL} linux-headers-amd64 dkms linux-headers-{RUNNING}",
    f"{INSTALL} --allow-downgrades --allow-change-held-packages nvidia-driver-cuda nvidia-kernel-open-dkms nvidia-persistenced",
    "for p in nvidia-driver-cuda nvidia-kernel-open-dkms nvidia-persistenced ; do dpkg-query -W -f='${Version}' \"$p\" "
    "| grep -Eq '^([0-9]+:)?590\\.' || { echo \"glm-flash: $p is not from driver branch 590 after install; "
    "does nvidia_repo_url carry it?\" >&2; exit 1; }; done",
    f"dkms autoinstall -k {RUNNING}",
    *whole(driver_ops.BLACKLIST_FILE, driver_ops.BLACKLIST_CONTENT),
    "update-initramfs -u -k all",
    "install -d -m 0755 -o root -g root /var/lib/glm-flash-deploy",
    f"echo {sha(driver_ops.BLACKLIST_CONTENT)} > {driver_ops.INITRAMFS_MARKER}",
    *whole(driver_ops.PERSISTENCED_DROPIN, driver_ops.PERSISTENCED_CONTENT),
    "systemctl daemon-reload",
    "systemctl enable nvidia-persistenced.service",  # started by the boot that loads the driver
]
OPS = [
    "openpgp_tool",
    "secure_boot_ready",
    "nvidia_repository",
    "driver_branch_pinned",
    "driver_installed",
    "driver_held",
    "modules_built",
    "nouveau_blacklisted",
    "persistence_mode",
    "rebooted_if_needed",
]


def test_fresh_host(monkeypatch):
    """Fresh host: gpg, the repository (key and branch checked by the host tool), NVIDIA's
    pinning package, headers for every kernel, driver, module, blacklist, persistence enabled
    (not started: nouveau holds the cards until the reboot).
    Holds and the reboot check see the facts from before the install (the real run re-reads
    them when each operation executes)."""
    rec = simulate(monkeypatch, fresh_host(), profile())
    assert rec.all_commands == FRESH_COMMANDS
    assert [name for name, _ in rec.calls] == OPS


def test_driver_current_changes_nothing(monkeypatch):
    rec = simulate(monkeypatch, current_host(), profile())
    assert rec.all_commands == []
    assert [name for name, _ in rec.calls] == OPS


def test_wrong_key_on_host_is_checked_again():
    """A keyring holding another key (or one more key) is not trusted: the tool runs again."""
    for state in (
        repo_state(fingerprints=("EB693B3035CD5710E231E123A4B469963BF863CC",)),
        repo_state(fingerprints=(FPR, "EB693B3035CD5710E231E123A4B469963BF863CC")),
        repo_state(sources_current=False),
    ):
        assert commands(
            driver_ops.nvidia_repository,
            current_host({NvidiaRepoState: state}),
            tool=TOOL,
            repo_url=REPO,
            key_url=KEY,
            fingerprint=FPR,
            branch="590",
            package="nvidia-driver-cuda",
        ) == [SETUP]


def test_pin_file_where_the_repository_has_no_pinning_package():
    facts = fresh_host({F(AptVersions, package=PINNING): []})
    assert commands(driver_ops.driver_branch_pinned, facts, branch="590") == whole(
        driver_ops.PIN_FILE, driver_ops.pin_content("590")
    )
    # the pinning package replaces our pin file once the repository carries it
    facts = current_host({F(Sha256File, path=driver_ops.PIN_FILE): sha(driver_ops.pin_content("590"))})
    assert commands(driver_ops.driver_branch_pinned, facts, branch="590") == [f"rm -f {driver_ops.PIN_FILE}"]


def test_reboot_after_fresh_install():
    """Right after the install: DKMS built 590 for the running kernel, nouveau still loaded."""
    facts = current_host({NvidiaLoadedModule: None, KernelModules: {"nouveau": {}}})
    assert commands(driver_ops.rebooted_if_needed, facts, allow_reboot=True) == [
        "function remove_any_askpass_file",
        "function capture_uptime",
        "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &",
        "function wait_and_reconnect",
        "function clean_sudo_info",
    ]
    with on(FakeHost(facts)):
        assert driver_ops.reboot_reasons() == [
            "driver 590.48.01 is installed but not loaded",
            "nouveau is loaded and holds the GPUs",
        ]


def test_no_reboot_into_a_kernel_without_the_module(caplog):
    """A new kernel is installed but DKMS did not build the module for it: rebooting would
    leave the box without its GPUs, so it does not reboot and says why."""
    facts = current_host(
        {
            Kernels: KernelState(RUNNING, (RUNNING, NEWER)),
            F(NvidiaModuleFor, kernel=NEWER): None,
            KernelHeaders: frozenset({RUNNING, NEWER}),
        }
    )
    fake = FakeHost(facts)
    with on(fake), caplog.at_level("WARNING", logger="pyinfra"):
        assert list(driver_ops.rebooted_if_needed._inner(allow_reboot=True)) == []
    assert f"not rebooting: the nvidia module is not built for kernel {NEWER}" in caplog.text
    assert commands(driver_ops.modules_built, facts) == [f"dkms autoinstall -k {NEWER}"]


def test_driver_present_but_old(monkeypatch):
    """570 installed and loaded, profile on 590: reinstall at 590 (downgrade/held allowed)."""
    pkgs = installed_packages("570.172.08-1")
    facts = current_host(
        {
            DebPackages: pkgs,
            AptHeldPackages: ["nvidia-driver-cuda", "nvidia-kernel-open-dkms"],
            NvidiaLoadedModule: LoadedModule("570.172.08", True),
            NvidiaModuleOnDisk: "570.172.08",
        }
    )
    rec = simulate(monkeypatch, facts, profile())
    # the 570 packages are not of the branch: not held; the pinning package is
    assert rec.all_commands == [
        SETUP,
        UPDATE,
        FRESH_COMMANDS[6],
        FRESH_COMMANDS[7],
        locked(f"apt-mark hold {PINNING}"),
    ]
    after = current_host({NvidiaLoadedModule: LoadedModule("570.172.08", True)})
    with on(FakeHost(after)):
        assert driver_ops.reboot_reasons() == ["driver 590.48.01 is installed, 570.172.08 is loaded"]


def test_branch_flip_is_one_value(monkeypatch):
    """driver_branch 595 on a current 590 host: the tool checks 595 is there, its pinning
    package, packages reinstalled."""
    facts = current_host({F(AptVersions, package="nvidia-driver-pinning-595"): ["595.58.03-1"]})
    rec = simulate(monkeypatch, facts, profile(driver_branch="595"))
    cmds = rec.all_commands
    assert cmds[0] == SETUP.replace("--branch 590", "--branch 595")
    assert cmds[1] == f"{INSTALL} nvidia-driver-pinning-595"
    assert cmds[3].endswith(
        "install --no-install-recommends --allow-downgrades --allow-change-held-packages "
        "nvidia-driver-cuda nvidia-kernel-open-dkms nvidia-persistenced"
    )
    assert "Pin: version /^([0-9]+:)?595\\./" in driver_ops.pin_content("595")


def test_kernel_upgraded_reboot_pending():
    facts = current_host({Kernels: KernelState(RUNNING, (RUNNING, NEWER))})
    with on(FakeHost(facts)):
        assert driver_ops.reboot_reasons() == [f"kernel {NEWER} is installed, {RUNNING} is running"]
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in commands(
        driver_ops.rebooted_if_needed, facts, allow_reboot=True
    )


def test_older_kernel_installed_needs_no_reboot():
    facts = current_host({Kernels: KernelState(NEWER, (RUNNING, NEWER))})
    assert commands(driver_ops.rebooted_if_needed, facts, allow_reboot=True) == []


def test_reboot_disallowed_says_why_and_does_not_reboot(caplog):
    facts = current_host(
        {Kernels: KernelState(RUNNING, (RUNNING, NEWER)), RebootRequired: RebootFlag(True, ("linux-image-" + NEWER,))}
    )
    fake = FakeHost(facts)
    with on(fake), caplog.at_level("WARNING", logger="pyinfra"):
        assert list(driver_ops.rebooted_if_needed._inner(allow_reboot=False)) == []
    assert (
        f"node1: reboot pending (allow_reboot is false, not rebooting): kernel {NEWER} is installed, "
        f"{RUNNING} is running; /run/reboot-required was set by linux-image-{NEWER}"
    ) in caplog.text
    assert fake.noops[0].startswith("reboot pending: kernel")


def test_kernels_stay_patchable_unless_hold_kernel():
    pkgs = {**kernel_packages(RUNNING), **driver_packages("590.48.01-1")}
    driver_only = driver_ops.hold_candidates(pkgs, "590", False)
    assert driver_only == ["libcuda1", "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced"]
    assert "nvidia-container-toolkit" not in driver_only  # not a driver package of branch 590
    with_kernel = driver_ops.hold_candidates(pkgs, "590", True)
    assert set(with_kernel) - set(driver_only) == {f"linux-image-{RUNNING}", "linux-image-amd64"}
    facts = {DebPackages: pkgs, AptHeldPackages: driver_only}
    assert commands(driver_ops.driver_held, facts, branch="590", hold_kernel=False) == []
    facts[AptHeldPackages] = ["nvidia-driver-cuda"]
    assert commands(driver_ops.driver_held, facts, branch="590", hold_kernel=False) == [
        locked("apt-mark hold libcuda1 nvidia-kernel-open-dkms nvidia-persistenced")
    ]
    # kernel holds from an earlier profile (or by hand, as the forum posts advised) are released
    facts[AptHeldPackages] = driver_only + ["linux-image-amd64"]
    assert commands(driver_ops.driver_held, facts, branch="590", hold_kernel=False) == [
        locked("apt-mark unhold linux-image-amd64")
    ]
    assert commands(driver_ops.driver_held, facts, branch="590", hold_kernel=True) == [
        locked(f"apt-mark hold linux-image-{RUNNING}")
    ]


def test_secure_boot_without_enrolled_key_stops_with_the_steps():
    off = fresh_host()
    assert commands(driver_ops.secure_boot_ready, off) == []
    enrolled = fresh_host({SecureBoot: SecureBootState(True, True, True)})
    assert commands(driver_ops.secure_boot_ready, enrolled) == []
    cmds = commands(driver_ops.secure_boot_ready, fresh_host({SecureBoot: SecureBootState(True, False, False)}))
    assert cmds[:3] == [UPDATE, f"{INSTALL} dkms mokutil", "dkms generate_mok"]
    assert cmds[3].startswith("mokutil --test-key /var/lib/dkms/mok.pub 2>&1 | grep -q 'is already enrolled' || {")
    assert "mokutil --import /var/lib/dkms/mok.pub" in cmds[3] and cmds[3].endswith("exit 1; }")
    # a container sees its host's firmware, not its own: nothing to decide there
    container = fresh_host({Kernels: KernelState(RUNNING, ()), SecureBoot: SecureBootState(True, False, False)})
    assert commands(driver_ops.secure_boot_ready, container) == []


def test_preinstalled_too_old():
    facts = {NvidiaLoadedModule: LoadedModule("575.57.08", True)}
    reason = refusal(driver_ops.driver_at_least, facts, minimum="580.0")
    assert "node1: driver_min_version: the installed driver 575.57.08 is older than 580.0" in reason


def test_preinstalled_current_checks_only(monkeypatch):
    gb10 = fakehost.gb10_box()
    facts = {
        NvidiaPciDevices: fakehost.GB10_BUS,
        NvidiaLoadedModule: LoadedModule("580.95.05", True),
    }
    rec = simulate(monkeypatch, facts, gb10)
    assert rec.calls == [("driver_at_least", [])]


def test_preinstalled_without_driver():
    facts = {NvidiaLoadedModule: None, NvidiaModuleOnDisk: None}
    assert "no NVIDIA driver is loaded or installed" in refusal(driver_ops.driver_at_least, facts, minimum="580.0")


def test_no_gpu_test_box_installs_from_the_repository_and_skips_gpu_steps(monkeypatch, caplog):
    """The sandbox's case: no GPU, require_gpu false. Repository, branch, packages and holds
    need no GPU and run (against the stand-in there); module builds, nouveau, persistence
    and reboot are skipped with the reason."""
    facts = fresh_host({NvidiaPciDevices: [], Kernels: KernelState(RUNNING, ())})
    with caplog.at_level("WARNING", logger="pyinfra"):
        rec = simulate(monkeypatch, facts, profile(require_gpu=False))
    assert [name for name, _ in rec.calls] == OPS[:6]
    assert f"linux-headers-{RUNNING}" not in " ".join(rec.all_commands)  # a container's kernel is not its own
    assert "skipped: nvidia module build per kernel, nouveau blacklist, persistence mode, reboot check" in caplog.text
    assert "no NVIDIA GPU on this host and require_gpu is false" in caplog.text


def test_local_mirror_with_its_own_key(monkeypatch):
    other = "0123456789ABCDEF0123456789ABCDEF01234567"
    rec = simulate(
        monkeypatch,
        fresh_host(),
        profile(
            nvidia_repo_url=MIRROR, nvidia_repo_key_url="file:///srv/mirror/key.asc", nvidia_repo_key_fingerprint=other
        ),
    )
    setup = rec.calls[2][1][0]
    assert f"--repo {MIRROR} --key-url file:///srv/mirror/key.asc --fingerprint {other}" in setup
    assert "nvidia.com" not in setup


@pytest.mark.parametrize(
    "data, key",
    [
        ({"nvidia_repo_key_url": "http://mirror.lan/key.asc"}, "nvidia_repo_key_url"),
        ({"nvidia_repo_key_fingerprint": "8793F200"}, "nvidia_repo_key_fingerprint"),
        (
            {"nvidia_repo_key_fingerprint": "02182E60 104FCDC2 6EAE1B85 97A5D4CB 8793F200"},
            "nvidia_repo_key_fingerprint",
        ),
        ({"driver_branch": "latest"}, "driver_branch"),
        ({"cuda_runfile_sha256": "abc"}, "cuda_runfile_sha256"),
        ({"cuda_version": "12.9"}, "cuda_runfile_url"),
    ],
)
def test_nvidia_values_have_a_shape(data, key):
    from control.profile import ProfileError

    with pytest.raises(ProfileError) as e:
        profile(**data)
    assert [p.key for p in e.value.problems] == [key]


def test_initramfs_rebuilt_only_when_blacklist_changed():
    done = current_host()
    assert commands(driver_ops.nouveau_blacklisted, done) == []
    # blacklist in place but the last rebuild did not finish: rebuild without rewriting the file
    half = current_host({F(FileContents, path=driver_ops.INITRAMFS_MARKER): None})
    assert commands(driver_ops.nouveau_blacklisted, half) == FRESH_COMMANDS[15:18]


def test_no_update_initramfs_is_reported_not_pretended(caplog):
    facts = fresh_host({F(Which, command="update-initramfs"): None})
    with caplog.at_level("WARNING", logger="pyinfra"):
        cmds = commands(driver_ops.nouveau_blacklisted, facts)
    assert not any("update-initramfs" in c for c in cmds)
    assert "skipped: initramfs rebuild" in caplog.text


def test_module_built_for_every_installed_kernel():
    facts = current_host(
        {
            Kernels: KernelState(RUNNING, (RUNNING, NEWER)),
            F(NvidiaModuleFor, kernel=NEWER): None,
            KernelHeaders: frozenset({RUNNING, NEWER}),
        }
    )
    assert commands(driver_ops.modules_built, facts) == [f"dkms autoinstall -k {NEWER}"]
    assert commands(driver_ops.modules_built, current_host()) == []


OLDER = "6.12.30+deb13-amd64"


def test_a_kernel_without_headers_is_skipped_and_named(caplog):
    """A kernel from before an upgrade keeps its image in /boot but has no headers
    (linux-headers-amd64 follows the newest only): dkms would fail the step on it (dkms#484).
    It is skipped and named; the kernels with headers still get the module."""
    facts = current_host(
        {
            Kernels: KernelState(RUNNING, (OLDER, RUNNING, NEWER)),
            F(NvidiaModuleFor, kernel=OLDER): None,
            F(NvidiaModuleFor, kernel=NEWER): None,
            KernelHeaders: frozenset({RUNNING, NEWER}),
        }
    )
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert commands(driver_ops.modules_built, facts) == [f"dkms autoinstall -k {NEWER}"]
    assert f"skipped: nvidia module for kernel {OLDER}: its headers are not installed" in caplog.text
    # built for the others: nothing to do, the old kernel still named
    caplog.clear()
    done = {**facts, F(NvidiaModuleFor, kernel=NEWER): "590.48.01"}
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert commands(driver_ops.modules_built, done) == []
    assert f"skipped: nvidia module for kernel {OLDER}" in caplog.text


def test_running_kernel_whose_headers_left_the_archive_gets_the_current_kernel(caplog):
    """Debian's archive keeps the current kernel ABI's headers only: a box not upgraded lately
    cannot install linux-headers-$(uname -r). The current image and its headers are installed
    instead (DKMS builds the module for that kernel), and the reboot step boots it."""
    stale = {
        Kernels: KernelState(RUNNING, (RUNNING,)),
        F(AptVersions, package=f"linux-headers-{RUNNING}"): [],
        KernelHeaders: frozenset(),
    }
    with caplog.at_level("WARNING", logger="pyinfra"):
        cmds = commands(driver_ops.driver_installed, fresh_host(stale), packages=OPEN, branch="590")
    assert cmds[:2] == [UPDATE, f"{INSTALL} linux-image-amd64 linux-headers-amd64 dkms"]
    assert f"linux-headers-{RUNNING} is not in the archive any more" in caplog.text
    # after that install: the new kernel has headers and the module; the running one is named, not built
    after = current_host(
        {
            Kernels: KernelState(RUNNING, (RUNNING, NEWER)),
            F(AptVersions, package=f"linux-headers-{RUNNING}"): [],
            DebPackages: {
                k: v for k, v in installed_packages("590.48.01-1").items() if k != f"linux-headers-{RUNNING}"
            },
            KernelHeaders: frozenset({NEWER}),
            F(NvidiaModuleFor, kernel=RUNNING): None,
            NvidiaLoadedModule: None,
            NvidiaModuleOnDisk: None,
            KernelModules: {"nouveau": {}},
        }
    )
    assert commands(driver_ops.driver_installed, after, packages=OPEN, branch="590") == []
    caplog.clear()
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert commands(driver_ops.modules_built, after) == []
    assert f"skipped: nvidia module for kernel {RUNNING}: its headers are not installed" in caplog.text
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in commands(
        driver_ops.rebooted_if_needed, after, allow_reboot=True
    )


def test_fact_parsers_on_the_commands_output():
    # od -An -tu1 of an efivar: 4 attribute bytes, then the value
    assert SecureBoot.parse(["sb 1", "key", "/var/lib/dkms/mok.pub is already enrolled"]) == SecureBootState(
        True, True, True
    )
    assert SecureBoot.parse(["sb 0"]) == SecureBootState(False, False, False)
    assert SecureBoot.parse(["sb 1", "key", "/var/lib/dkms/mok.pub is not enrolled"]) == SecureBootState(
        True, True, False
    )
    assert AptVersions.parse(
        [
            " nvidia-driver-cuda | 595.58.03-1 | http://r/ Packages",
            " nvidia-driver-cuda | 590.48.01-1 | http://r/ Packages",
        ]
    ) == ["595.58.03-1", "590.48.01-1"]
    assert AptVersions.parse([]) == []
    assert NvidiaRepoState.parse(["missing"]) is None
    assert NvidiaRepoState.parse(['{"fingerprints": ["AB"], "sources_current": true}']) == repo_state(("AB",))
    assert NvidiaModuleFor.parse(["590.48.01"]) == "590.48.01" and NvidiaModuleFor.parse([]) is None


def test_persistenced_is_started_only_when_the_driver_on_disk_runs(caplog):
    """Before the reboot nouveau holds the cards and nvidia-persistenced would exit ("Failed to
    query NVIDIA devices", NVIDIA/ansible-role-nvidia-driver#3), stopping the run before its own
    reboot: it is enabled only, and the run goes on to the reboot step. After the reboot (the
    module on disk is the one loaded) it is started; a new drop-in restarts it."""
    before = current_host(
        {NvidiaLoadedModule: None, KernelModules: {"nouveau": {}}, SystemdStatus: {}, SystemdEnabled: {}}
    )
    with caplog.at_level("WARNING", logger="pyinfra"):
        assert commands(driver_ops.persistence_mode, before) == ["systemctl enable nvidia-persistenced.service"]
    assert (
        "nvidia-persistenced enabled, not started until the reboot: driver 590.48.01 is installed but not "
        "loaded (nouveau holds the GPUs)" in caplog.text
    )
    # an older driver still loaded (a branch move before its reboot): not started either
    older = current_host({NvidiaLoadedModule: LoadedModule("570.172.08", True), SystemdStatus: {}})
    assert commands(driver_ops.persistence_mode, older) == []
    # after the reboot: enabled by the first run, started (systemd would have; a run converges either way)
    after = current_host({SystemdStatus: {"nvidia-persistenced.service": False}})
    assert commands(driver_ops.persistence_mode, after) == ["systemctl start nvidia-persistenced.service"]
    assert commands(driver_ops.persistence_mode, current_host()) == []
    stale = current_host({F(Sha256File, path=driver_ops.PERSISTENCED_DROPIN): None})
    assert commands(driver_ops.persistence_mode, stale)[-2:] == [
        "systemctl daemon-reload",
        "systemctl restart nvidia-persistenced.service",
    ]


def test_a_plan_on_the_fake_host_ignores_a_real_run_facts_cache(tmp_path, monkeypatch):
    """A real deploy of a host named node1 (the fleet sandbox's first worker) leaves its facts
    cache on the control machine; the next plan on a fake host of that name wants those facts and
    reads them together through the host's connector arguments. The fake host has pyinfra's
    defaults for them and no shell, so the plan falls back to the facts the test gave: CI's run
    once failed here ('FakeState' object has no attribute 'config')."""
    monkeypatch.setenv("GLM_FLASH_CACHE", str(tmp_path))
    facts_dir = tmp_path / "facts"
    facts_dir.mkdir(mode=0o700)
    tmp_path.chmod(0o700)
    cached = [{"fact": "pyinfra.facts.deb.DebPackages", "args": {}}, {"fact": "roles.facts.driver.Kernels", "args": {}}]
    (facts_dir / "node1.json").write_text(json.dumps(cached))
    (facts_dir / "node1.json").chmod(0o600)
    cmds = commands(
        driver_ops.driver_installed,
        {DebPackages: {}, Kernels: KernelState("6.12.38+deb13-amd64", ())},
        packages=["sed"],
        branch="4",
    )
    assert cmds[-1].startswith("for p in sed ;")
