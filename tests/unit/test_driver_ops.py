"""Driver role, command level: given the facts of a host in each situation, the exact
commands the operations yield (their `_inner` generators on a fake host).

Simulated: NVIDIA's apt repository and a GPU are not available here, so the facts a
GPU host would report (PCI devices, loaded module, installed packages, kernels) are
given by each test. What can run for real does so elsewhere: apt holds and the apt pin
in tests/sandbox/test_apt_hold_rootfs.py, the whole deploy in tests/sandbox.
"""

import pytest
from pyinfra.api import OperationError
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import File, FileContents, Sha256File
from pyinfra.facts.server import KernelModules, Which
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus

from fakehost import F, FakeHost, Recorder, commands, on
from roles import apt_hold, driver
from roles.apt_hold import AptHeldPackages
from roles.driver_facts import KernelState, LoadedModule, Kernels, NvidiaLoadedModule, NvidiaModuleOnDisk, \
    NvidiaPciDevices, PciDevice, RebootFlag, RebootRequired
from roles.profile import Profile, build

RUNNING = "6.12.38+deb13-amd64"
NEWER = "6.12.41+deb13-amd64"
REPO = "https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/"
KEY = REPO + "3bf863cc.pub"
MIRROR = "http://mirror.lan/nvidia/debian13/x86_64/"
KEYRING = driver.keyring_path(KEY)
INSTALL = ('DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
           '-o Dpkg::Options::="--force-confold" install --no-install-recommends')
OPEN = ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced"]
L40S = [PciDevice("0000:01:00.0", "0x26b9", "0x030200"), PciDevice("0000:41:00.0", "0x26b9", "0x030200")]


def sha(text):
    return driver._sha256(text)


def kernel_packages(*releases):
    pkgs = {"linux-image-amd64": {"6.12.38-1"}, "linux-headers-amd64": {"6.12.38-1"}}
    for r in releases:
        pkgs[f"linux-image-{r}"] = {"6.12.38-1"}
    return pkgs


def driver_packages(version):
    return {"nvidia-driver-cuda": {version}, "nvidia-kernel-open-dkms": {version}, "nvidia-persistenced": {version},
            "libcuda1": {version}, "nvidia-container-toolkit": {"1.17.8-1"}}


def fresh_host(over=None):
    """Debian 13 after install: kernel only, nothing of ours."""
    facts = {
        NvidiaPciDevices: L40S,
        Kernels: KernelState(RUNNING, (RUNNING,)),
        DebPackages: kernel_packages(RUNNING),
        F(File, path=KEYRING): None,
        F(Sha256File, path=driver.SOURCES_FILE): None,
        F(Sha256File, path=driver.PIN_FILE): None,
        F(Sha256File, path=driver.BLACKLIST_FILE): None,
        F(FileContents, path=driver.INITRAMFS_MARKER): None,
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


def current_host(over=None):
    """Everything this role does is done and running: driver 580.95.05 loaded."""
    pkgs = {**kernel_packages(RUNNING), f"linux-headers-{RUNNING}": {"6.12.38-1"}, "dkms": {"3.2.2-1"},
            **driver_packages("580.95.05-1")}
    facts = fresh_host()
    facts.update({
        DebPackages: pkgs,
        F(File, path=KEYRING): {"mode": 644},
        F(Sha256File, path=driver.SOURCES_FILE): sha(driver.sources_content(REPO, KEY)),
        F(Sha256File, path=driver.PIN_FILE): sha(driver.pin_content("580")),
        F(Sha256File, path=driver.BLACKLIST_FILE): sha(driver.BLACKLIST_CONTENT),
        F(FileContents, path=driver.INITRAMFS_MARKER): [sha(driver.BLACKLIST_CONTENT)],
        SystemdStatus: {"nvidia-persistenced.service": True},
        SystemdEnabled: {"nvidia-persistenced.service": True},
        AptHeldPackages: sorted(driver.hold_candidates(pkgs, "580")),
        NvidiaLoadedModule: LoadedModule("580.95.05", True),
        NvidiaModuleOnDisk: "580.95.05",
        KernelModules: {"nvidia": {}, "nvidia_uvm": {}},
    })
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
        driver.apply(prof)
    return rec


FRESH_COMMANDS = [
    "install -d -m 0755 /etc/apt/keyrings",
    f"curl -fsSL --retry 3 -o {KEYRING}.tmp {KEY} && grep -q 'BEGIN PGP PUBLIC KEY BLOCK' {KEYRING}.tmp && "
    f"chmod 0644 {KEYRING}.tmp && mv {KEYRING}.tmp {KEYRING} || {{ rm -f {KEYRING}.tmp ; echo "
    f"'glm-flash: no ASCII-armored key at {KEY} (nvidia_repo_key_url)' >&2; false; }}",
    f"upload {driver.SOURCES_FILE}\n{driver.sources_content(REPO, KEY)}",
    f"chmod 644 {driver.SOURCES_FILE}",
    f"upload {driver.PIN_FILE}\n{driver.pin_content('580')}",
    f"chmod 644 {driver.PIN_FILE}",
    "apt-get update",
    f"{INSTALL} linux-headers-{RUNNING} dkms",
    f"{INSTALL} --allow-downgrades --allow-change-held-packages nvidia-driver-cuda nvidia-kernel-open-dkms nvidia-persistenced",
    "for p in nvidia-driver-cuda nvidia-kernel-open-dkms nvidia-persistenced ; do dpkg-query -W -f='${Version}' \"$p\" "
    "| grep -Eq '^([0-9]+:)?580\\.' || { echo \"glm-flash: $p is not from driver branch 580 after install; "
    "does nvidia_repo_url carry it?\" >&2; exit 1; }; done",
    f"dkms autoinstall -k {RUNNING}",
    f"upload {driver.BLACKLIST_FILE}\n{driver.BLACKLIST_CONTENT}",
    f"chmod 644 {driver.BLACKLIST_FILE}",
    "update-initramfs -u -k all",
    "install -d -m 0755 /var/lib/glm-flash",
    f"echo {sha(driver.BLACKLIST_CONTENT)} > {driver.INITRAMFS_MARKER}",
    "systemctl start nvidia-persistenced.service",
    "systemctl enable nvidia-persistenced.service",
    f"apt-mark hold linux-headers-amd64 linux-image-{RUNNING} linux-image-amd64",
]


def test_fresh_host(monkeypatch):
    """Fresh host: repository, pin, headers, driver, blacklist + initramfs, persistence,
    holds. The reboot check sees the facts from before the install (the real run re-reads
    them when the operation executes; test_reboot_after_fresh_install covers that)."""
    rec = simulate(monkeypatch, fresh_host(), profile())
    assert rec.all_commands == FRESH_COMMANDS
    assert [name for name, _ in rec.calls] == [
        "nvidia_repository", "driver_branch_pinned", "driver_installed", "dkms_module_built",
        "nouveau_blacklisted", "persistence_mode", "driver_and_kernel_held", "rebooted_if_needed"]


def test_driver_current_changes_nothing(monkeypatch):
    rec = simulate(monkeypatch, current_host(), profile())
    assert rec.all_commands == []
    assert len(rec.calls) == 8


def test_reboot_after_fresh_install():
    """Right after the install: DKMS built 580 for the running kernel, nouveau still loaded."""
    facts = current_host({NvidiaLoadedModule: None, KernelModules: {"nouveau": {}}})
    assert commands(driver.rebooted_if_needed, facts, allow_reboot=True) == [
        "function remove_any_askpass_file", "function capture_uptime",
        "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &", "function wait_and_reconnect",
        "function clean_sudo_info"]
    with on(FakeHost(facts)):
        assert driver.reboot_reasons() == ["driver 580.95.05 is installed but not loaded",
                                           "nouveau is loaded and holds the GPUs"]


def test_driver_present_but_old(monkeypatch):
    """570 installed and loaded, profile on 580: reinstall at 580 (downgrade/held allowed),
    hold only what is of branch 580 (none yet at this point) and the kernel."""
    pkgs = {**kernel_packages(RUNNING), f"linux-headers-{RUNNING}": {"6.12.38-1"}, "dkms": {"3.2.2-1"},
            **driver_packages("570.172.08-1")}
    held_before = ["linux-headers-amd64", f"linux-headers-{RUNNING}", f"linux-image-{RUNNING}", "linux-image-amd64",
                   "nvidia-driver-cuda", "nvidia-kernel-open-dkms"]
    facts = current_host({DebPackages: pkgs, AptHeldPackages: held_before,
                            NvidiaLoadedModule: LoadedModule("570.172.08", True), NvidiaModuleOnDisk: "570.172.08"})
    rec = simulate(monkeypatch, facts, profile())
    assert rec.all_commands == [
        "apt-get update",
        f"{INSTALL} --allow-downgrades --allow-change-held-packages nvidia-driver-cuda nvidia-kernel-open-dkms nvidia-persistenced",
        FRESH_COMMANDS[9],
    ]
    # when the reboot check runs, 580 is on disk and 570 still loaded
    after = current_host({NvidiaLoadedModule: LoadedModule("570.172.08", True)})
    with on(FakeHost(after)):
        assert driver.reboot_reasons() == ["driver 580.95.05 is installed, 570.172.08 is loaded"]
    assert commands(driver.rebooted_if_needed, after, allow_reboot=True)[2] == \
        "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &"


def test_branch_flip_is_one_value(monkeypatch):
    """driver_branch 590 on a current 580 host: new pin, packages reinstalled, holds of 590."""
    rec = simulate(monkeypatch, current_host(), profile(driver_branch="590"))
    cmds = rec.all_commands
    assert cmds[0] == f"upload {driver.PIN_FILE}\n{driver.pin_content('590')}"
    assert "Pin: version /^([0-9]+:)?590\\./" in cmds[0]
    assert cmds[3].endswith("install --no-install-recommends --allow-downgrades --allow-change-held-packages "
                            "nvidia-driver-cuda nvidia-kernel-open-dkms nvidia-persistenced")
    assert "580" not in driver.pin_content("590")


def test_proprietary_modules_when_open_modules_off(monkeypatch):
    rec = simulate(monkeypatch, fresh_host(), profile(driver_open_modules=False))
    assert f"{INSTALL} --allow-downgrades --allow-change-held-packages nvidia-driver-cuda nvidia-kernel-dkms " \
           "nvidia-persistenced" in rec.all_commands


def test_kernel_upgraded_reboot_pending():
    facts = current_host({Kernels: KernelState(RUNNING, (RUNNING, NEWER))})
    with on(FakeHost(facts)):
        assert driver.reboot_reasons() == [f"kernel {NEWER} is installed, {RUNNING} is running"]
    assert "( sleep 1 && reboot ) </dev/null >/dev/null 2>&1 &" in \
        commands(driver.rebooted_if_needed, facts, allow_reboot=True)


def test_older_kernel_installed_needs_no_reboot():
    facts = current_host({Kernels: KernelState(NEWER, (RUNNING, NEWER))})
    assert commands(driver.rebooted_if_needed, facts, allow_reboot=True) == []


def test_reboot_disallowed_says_why_and_does_not_reboot(caplog):
    facts = current_host({Kernels: KernelState(RUNNING, (RUNNING, NEWER)),
                            RebootRequired: RebootFlag(True, ("linux-image-" + NEWER,))})
    fake = FakeHost(facts)
    with on(fake), caplog.at_level("WARNING", logger="pyinfra"):
        assert list(driver.rebooted_if_needed._inner(allow_reboot=False)) == []
    assert (f"node1: reboot pending (allow_reboot is false, not rebooting): kernel {NEWER} is installed, "
            f"{RUNNING} is running; /run/reboot-required was set by linux-image-{NEWER}") in caplog.text
    assert fake.noops[0].startswith("reboot pending: kernel")


def test_held_packages_already_held():
    pkgs = {**kernel_packages(RUNNING), **driver_packages("580.95.05-1")}
    all_held = driver.hold_candidates(pkgs, "580")
    assert all_held == ["libcuda1", "linux-headers-amd64", f"linux-image-{RUNNING}", "linux-image-amd64",
                        "nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-persistenced"]
    assert "nvidia-container-toolkit" not in all_held     # not a driver package of branch 580
    facts = {DebPackages: pkgs, AptHeldPackages: all_held}
    assert commands(driver.driver_and_kernel_held, facts, branch="580") == []
    facts[AptHeldPackages] = ["linux-image-amd64", "nvidia-driver-cuda"]
    assert commands(driver.driver_and_kernel_held, facts, branch="580") == [
        f"apt-mark hold libcuda1 linux-headers-amd64 linux-image-{RUNNING} nvidia-kernel-open-dkms nvidia-persistenced"]


def test_debian_source_refused(monkeypatch, capsys):
    values = profile().as_dict()
    values["driver_source"] = "debian"
    fake = FakeHost(fresh_host())
    rec = Recorder(fake)
    rec.patch(monkeypatch, driver, apt_hold)
    with on(fake), pytest.raises(SystemExit) as exit_info:
        driver.apply(Profile("node1", values))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "node1: driver_source: Debian 13 ships driver 550, CUDA 12.8 needs 570.26 or newer" in err
    assert "no host was changed" in err
    assert rec.calls == [] and fake.fact_calls == []


def test_preinstalled_too_old():
    facts = {NvidiaLoadedModule: LoadedModule("575.57.08", True)}
    with pytest.raises(OperationError, match=r"node1: driver_min_version: the installed driver 575.57.08 is older than 580.0"):
        commands(driver.driver_at_least, facts, minimum="580.0")


def test_preinstalled_current_checks_only(monkeypatch):
    gb10 = build("spark", {"platform": "gb10", "vllm_ref": "0123456789abcdef0123456789abcdef01234567", "accept_drafter_license": True}, api_key_present=False)
    facts = {NvidiaPciDevices: [PciDevice("000f:01:00.0", "0x2e12", "0x030000")],
             NvidiaLoadedModule: LoadedModule("580.95.05", True)}
    rec = simulate(monkeypatch, facts, gb10)
    assert rec.calls == [("driver_at_least", [])]


def test_preinstalled_without_driver():
    with pytest.raises(OperationError, match="no NVIDIA driver is loaded or installed"):
        commands(driver.driver_at_least, {NvidiaLoadedModule: None, NvidiaModuleOnDisk: None}, minimum="580.0")


def test_no_gpu_on_test_box_skips_with_reason(monkeypatch, caplog):
    with caplog.at_level("WARNING", logger="pyinfra"):
        rec = simulate(monkeypatch, {NvidiaPciDevices: []}, profile(require_gpu=False))
    assert rec.calls == []
    assert "[node1] skipped: NVIDIA driver (nvidia-repo)" in caplog.text
    assert "no NVIDIA GPU on this host and require_gpu is false" in caplog.text


def test_missing_gpu_on_real_node_fails(monkeypatch):
    with pytest.raises(OperationError, match="expects 2 NVIDIA GPU.*shows 1"):
        simulate(monkeypatch, fresh_host({NvidiaPciDevices: L40S[:1]}), profile())


def test_local_mirror_from_profile(monkeypatch):
    rec = simulate(monkeypatch, fresh_host({F(File, path=driver.keyring_path(MIRROR + "key.asc")): None}),
                   profile(nvidia_repo_url=MIRROR, nvidia_repo_key_url=MIRROR + "key.asc"))
    repo_cmds = rec.calls[0][1]
    assert f"URIs: {MIRROR}\n" in repo_cmds[2]
    assert MIRROR + "key.asc" in repo_cmds[1]
    assert "nvidia.com" not in "".join(repo_cmds)


@pytest.mark.parametrize("url", ["ftp://x/y", "developer.download.nvidia.com/repo", "https://x/y'; reboot"])
def test_bad_repository_url(url):
    with pytest.raises(Exception, match="nvidia_repo_url"):
        commands(driver.nvidia_repository, {}, repo_url=url, key_url=KEY)


def test_initramfs_rebuilt_only_when_blacklist_changed():
    done = current_host()
    assert commands(driver.nouveau_blacklisted, done) == []
    # blacklist in place but the last rebuild did not finish: rebuild without rewriting the file
    half = current_host({F(FileContents, path=driver.INITRAMFS_MARKER): None})
    assert commands(driver.nouveau_blacklisted, half) == FRESH_COMMANDS[13:16]


def test_no_update_initramfs_is_reported_not_pretended(caplog):
    facts = fresh_host({F(Which, command="update-initramfs"): None})
    with caplog.at_level("WARNING", logger="pyinfra"):
        cmds = commands(driver.nouveau_blacklisted, facts)
    assert not any("update-initramfs" in c for c in cmds)
    assert "skipped: initramfs rebuild" in caplog.text


def test_dkms_build_missing_for_running_kernel():
    assert commands(driver.dkms_module_built, {NvidiaModuleOnDisk: None}, kernel_release=RUNNING) == [
        f"dkms autoinstall -k {RUNNING}"]
    assert commands(driver.dkms_module_built, {NvidiaModuleOnDisk: "580.95.05"}, kernel_release=RUNNING) == []
