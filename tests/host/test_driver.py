"""NVIDIA driver and CUDA toolkit on a deployed node (roles/driver.py, roles/toolkit.py).

GPU checks are marked `gpu`: on a host with no NVIDIA device whose profile does not require
one (the sandbox) they are reported not applicable, not passed; on a host that should have
GPUs whose driver does not answer they fail, naming the cause (tests/host/conftest.py). The repository, key, branch and toolkit checks run on
the sandbox too (against its stand-in repository).
"""

import re

import pytest

from roles import driver, toolkit
from roles.facts.driver import NvidiaLoadedModule, version_at_least
from roles.operations import driver as driver_ops
from roles.operations import toolkit as toolkit_ops


def _lines(host, command):
    out = host.run(command)
    assert out.rc == 0, f"{command}: {out.stderr}"
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


@pytest.mark.gpu
def test_driver_loaded_and_matches_userspace(host, profile):
    loaded = NvidiaLoadedModule.parse(host.file("/proc/driver/nvidia/version").content_string.splitlines())
    assert loaded, "no nvidia kernel module loaded"
    userspace = set(_lines(host, "nvidia-smi --query-gpu=driver_version --format=csv,noheader"))
    assert userspace == {loaded.version}, f"kernel module {loaded.version}, userspace {userspace}: reboot pending?"
    assert version_at_least(loaded.version, profile.driver_min_version)
    if profile.driver_source == "nvidia-repo":
        assert loaded.version.split(".")[0] == str(profile.driver_branch)
        assert loaded.open == bool(profile.driver_open_modules), "open vs proprietary kernel modules"


@pytest.mark.gpu
def test_gpu_count_and_compute_capability(host, profile):
    caps = _lines(host, "nvidia-smi --query-gpu=compute_cap --format=csv,noheader")
    assert len(caps) == profile.gpu_count
    assert set(caps) == {profile.gpu_compute_capability}


@pytest.mark.gpu
def test_persistence_mode_on(host, profile):
    modes = _lines(host, "nvidia-smi --query-gpu=persistence_mode --format=csv,noheader")
    assert modes and set(modes) == {"Enabled"}, modes
    if profile.driver_source == "nvidia-repo":
        service = host.service("nvidia-persistenced")
        assert service.is_enabled and service.is_running
        assert "--persistence-mode" in host.run("ps -o args= -C nvidia-persistenced").stdout


def test_nouveau_not_loaded(host):  # needs no GPU: nouveau must not hold the cards anywhere
    # /sys/module/nouveau exists while it is loaded (read also where /proc/modules is hidden)
    assert not host.file("/sys/module/nouveau").exists, "nouveau is loaded: it holds the cards the driver needs"


def _nvidia_repo(profile):
    if profile.driver_source != "nvidia-repo":
        pytest.skip(f"not applicable: driver_source is {profile.driver_source}")


def test_only_the_pinned_key_is_trusted_for_the_repository(host, profile):
    _nvidia_repo(profile)
    keys = _lines(host, f"gpg --batch --no-default-keyring --with-colons --show-keys {driver_ops.KEYRING}")
    primaries = [
        line.split(":")[9] for i, line in enumerate(keys) if line.startswith("fpr:") and keys[i - 1].startswith("pub:")
    ]
    assert primaries == [profile.nvidia_repo_key_fingerprint.upper()]
    sources = host.file(driver_ops.SOURCES_FILE).content_string
    assert f"URIs: {profile.nvidia_repo_url}\n" in sources and f"Signed-By: {driver_ops.KEYRING}\n" in sources
    assert not host.run("grep -rl 3bf863cc /etc/apt/sources.list.d /etc/apt/keyrings /etc/apt/trusted.gpg.d").stdout


def test_pinned_branch_installed_and_held(host, profile):
    _nvidia_repo(profile)
    branch = str(profile.driver_branch)
    held = set(_lines(host, "apt-mark showhold"))
    for package in driver.DRIVER_PACKAGES[bool(profile.driver_open_modules)]:
        version = host.package(package).version
        assert version.split(".")[0].split(":")[-1] == branch, f"{package} {version} is not of branch {branch}"
        assert package in held, f"{package} is not held"
    pinning = host.package(f"nvidia-driver-pinning-{branch}")
    pin = host.file(driver_ops.PIN_FILE)
    assert pinning.is_installed or (pin.exists and pin.content_string == driver_ops.pin_content(branch))
    candidate = host.run("apt-cache policy nvidia-driver-cuda | awk '/Candidate:/{print $2}'").stdout.strip()
    assert candidate.split(".")[0].split(":")[-1] == branch, f"apt would move to {candidate}"


def test_kernels_stay_patchable(host, profile):
    _nvidia_repo(profile)
    assert host.package("linux-headers-amd64").is_installed, "new kernels would get no headers, so no module"
    if not profile.hold_kernel:
        held = set(_lines(host, "apt-mark showhold"))
        assert not [p for p in held if p.startswith("linux-")], f"kernel packages held: {held}"


@pytest.mark.gpu
def test_module_built_for_every_installed_kernel(host):
    kernels = [p.removeprefix("/boot/vmlinuz-") for p in host.run("ls /boot/vmlinuz-*").stdout.split()]
    assert kernels
    for kernel in kernels:
        out = host.run(f"modinfo -k {kernel} -F version nvidia")
        assert out.rc == 0 and out.stdout.strip(), (
            f"no nvidia module for kernel {kernel}: a reboot into it loses the GPUs"
        )


@pytest.mark.gpu
def test_no_reboot_pending(host):
    running = host.run("uname -r").stdout.strip()
    installed = sorted(re.sub(r"^/boot/vmlinuz-", "", p) for p in host.run("ls /boot/vmlinuz-*").stdout.split())
    assert running in installed
    module = host.run("modinfo -F version nvidia").stdout.strip()
    loaded = NvidiaLoadedModule.parse(host.file("/proc/driver/nvidia/version").content_string.splitlines())
    assert loaded and module == loaded.version, f"driver {module} installed, {loaded} loaded"


def test_toolkit_at_its_own_path_with_nvcc(host, profile):
    """The repository's package or NVIDIA's runfile (the sandbox: its stand-in), at its own path."""
    path = toolkit.toolkit_path(profile)
    if profile.driver_source != "nvidia-repo" and not host.file(path).exists:
        pytest.skip(f"not applicable: driver_source {profile.driver_source} and no toolkit here")
    assert host.file(path).is_directory
    out = host.run(f"{path}/bin/nvcc --version")
    assert out.rc == 0, out.stderr
    assert f"release {profile.cuda_version}," in out.stdout, out.stdout
    package = host.package(toolkit_ops.toolkit_package(profile.cuda_version))
    marker = host.file(f"{path}/{toolkit_ops.RUNFILE_MARKER}")
    assert package.is_installed or (marker.exists and marker.content_string.strip() == profile.cuda_runfile_sha256)


def test_toolkit_install_did_not_pull_driver_metapackages(host, profile):  # needs no GPU
    if profile.driver_source != "nvidia-repo":
        pytest.skip(f"not applicable: driver_source is {profile.driver_source}")
    for meta in ("cuda", f"cuda-{profile.cuda_version.replace('.', '-')}", "cuda-drivers"):
        assert not host.package(meta).is_installed, f"{meta} pulls the driver; install cuda-toolkit-X-Y only"
