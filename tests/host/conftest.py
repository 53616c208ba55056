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


@pytest.fixture
def has_gpu(host) -> bool:
    return host.run("nvidia-smi -L").rc == 0


@pytest.fixture(autouse=True)
def _gpu_marker(request):
    if request.node.get_closest_marker("gpu"):
        host = request.getfixturevalue("host")
        if host.run("nvidia-smi -L").rc != 0:
            pytest.skip("not applicable: no NVIDIA GPU on this host")
