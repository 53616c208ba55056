"""Host checks: the state a deployed node must be in. Runs against the sandbox (after
deploying it) or a real host:

    pytest tests/host --inventory inventory/l40s.py --hosts ssh://root@gpu1.example.lan
"""

from __future__ import annotations

import pytest

from control.profile import Profile, build
from tests.conftest import inventory_hosts


@pytest.fixture(scope="session", autouse=True)
def _deployed(sandbox_deploys):
    """On the sandbox, checks run after the session's deploy."""
    return sandbox_deploys


@pytest.fixture(scope="session")
def inventory_data(request) -> tuple[str, dict]:
    """The checked host's entry in the inventory as written (name, data), before any default."""
    entries = inventory_hosts(request.config.getoption("--inventory"))
    hosts = request.config.getoption("hosts") or ""
    wanted = hosts.split("://")[-1].split("@")[-1].split(":")[0].split("?")[0]
    for name, data in entries:
        if name == wanted or len(entries) == 1:
            return name, data
    pytest.fail(f"host {wanted!r} is not in {request.config.getoption('--inventory')}; pass the inventory that has it")


@pytest.fixture(scope="session")
def profile(inventory_data) -> Profile:
    """The resolved profile of the checked host, from the inventory."""
    return build(*inventory_data)


# Every PCI function whose vendor is NVIDIA (0x10de): the cards of an L40S box, GB10's GPU.
NVIDIA_PCI = "grep -lx 0x10de /sys/bus/pci/devices/*/vendor 2>/dev/null | xargs -r -n1 dirname | xargs -r -n1 basename"


def gpu_answers(host, profile: Profile) -> bool:
    """True where the GPUs answer; False only where the host has no NVIDIA device and the profile
    does not require one (the sandbox). A host that should have GPUs whose driver does not
    answer fails the calling check, naming why: a broken GPU box is not "not applicable"."""
    smi = host.run("nvidia-smi -L")
    if smi.rc == 0 and smi.stdout.strip():
        return True
    devices = host.run(NVIDIA_PCI).stdout.split()
    if not devices and not profile.require_gpu:
        return False
    why = f"NVIDIA device(s) at {', '.join(devices)}" if devices else "the profile sets require_gpu: true"
    # /sys/module/<name> exists for a loaded module (also where /proc/modules is hidden, as in a container)
    if host.file("/sys/module/nouveau").exists:
        cause = "nouveau is loaded and holds the cards (the deploy blacklists it; reboot to finish)"
    elif not host.file("/sys/module/nvidia").exists:
        cause = "the nvidia kernel module is not loaded (dmesg | grep -i nvidia; DKMS build or Secure Boot?)"
    else:
        cause = "the nvidia module is loaded but nvidia-smi does not answer (driver/userspace mismatch? reboot after an upgrade?)"
    pytest.fail(
        f"this host should have working GPUs ({why}), but `nvidia-smi -L` failed "
        f"(exit {smi.rc}: {(smi.stderr or smi.stdout).strip()[:200]}): {cause}"
    )


@pytest.fixture
def has_gpu(host, profile) -> bool:
    return gpu_answers(host, profile)


@pytest.fixture(autouse=True)
def _gpu_marker(request):
    if request.node.get_closest_marker("gpu"):
        if not gpu_answers(request.getfixturevalue("host"), request.getfixturevalue("profile")):
            pytest.skip("not applicable: no NVIDIA device on this host and require_gpu is false")
    if request.node.get_closest_marker("serving"):
        profile = request.getfixturevalue("profile")
        # an engine that starts without a GPU (the sandbox's CPU engine) serves: checked, never skipped
        if profile.gpu_count and not gpu_answers(request.getfixturevalue("host"), profile):
            pytest.skip("not applicable: no NVIDIA device on this host and require_gpu is false (no engine serves)")
