"""NVIDIA driver and CUDA toolkit on a deployed node (roles/driver.py, roles/toolkit.py).

GPU checks are marked `gpu`: on a host without an NVIDIA GPU (the sandbox) they are
reported not applicable, not passed.
"""

import re

import pytest

from roles import driver, toolkit
from roles.driver_facts import NvidiaLoadedModule, version_at_least


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


@pytest.mark.gpu
def test_nouveau_not_loaded(host):
    assert "nouveau" not in host.file("/proc/modules").content_string.split()


@pytest.mark.gpu
def test_driver_and_kernel_packages_held(host, profile):
    if profile.driver_source != "nvidia-repo":
        pytest.skip(f"not applicable: driver_source is {profile.driver_source}")
    held = set(_lines(host, "apt-mark showhold"))
    running = host.run("uname -r").stdout.strip()
    for package in ("nvidia-driver-cuda", driver.DRIVER_PACKAGES[bool(profile.driver_open_modules)][1],
                    f"linux-image-{running}", f"linux-headers-{running}"):
        assert package in held, f"{package} is not held"
    pin = host.file(driver.PIN_FILE)
    assert pin.exists and pin.content_string == driver.pin_content(str(profile.driver_branch))


@pytest.mark.gpu
def test_no_reboot_pending(host):
    running = host.run("uname -r").stdout.strip()
    installed = sorted(re.sub(r"^/boot/vmlinuz-", "", p) for p in host.run("ls /boot/vmlinuz-*").stdout.split())
    assert running in installed
    module = host.run("modinfo -F version nvidia").stdout.strip()
    loaded = NvidiaLoadedModule.parse(host.file("/proc/driver/nvidia/version").content_string.splitlines())
    assert loaded and module == loaded.version, f"driver {module} installed, {loaded} loaded"


@pytest.mark.gpu
def test_toolkit_at_its_own_path_with_nvcc(host, profile):
    path = toolkit.toolkit_path(profile)
    assert host.file(path).is_directory
    out = host.run(f"{path}/bin/nvcc --version")
    assert out.rc == 0, out.stderr
    assert f"release {profile.cuda_version}," in out.stdout, out.stdout


@pytest.mark.gpu
def test_toolkit_install_did_not_pull_driver_metapackages(host, profile):
    if profile.driver_source != "nvidia-repo":
        pytest.skip(f"not applicable: driver_source is {profile.driver_source}")
    for meta in ("cuda", f"cuda-{profile.cuda_version.replace('.', '-')}", "cuda-drivers"):
        assert not host.package(meta).is_installed, f"{meta} pulls the driver; install cuda-toolkit-X-Y only"
