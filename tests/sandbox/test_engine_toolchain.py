"""What the engine's JIT builds, its syscalls and its device nodes meet under the deployed unit's own
properties: `glm-flash-gpu-check run` on the sandbox, a transient unit with every [Service] line of
glm-flash.service (drop-ins included) but how it starts and restarts (#35).

Simulated: the CUDA toolkit (the stand-in runfile's nvcc compiles host code with the system's
c++; the real toolkit's runfile is not reachable here) and the GPU (none: the CUDA and NCCL parts
are n/a, never ok; their pass path is the `gpu` host check in tests/host/test_service.py). Each
breakage is a drop-in under /run for glm-flash.service, removed afterwards:
- the PATH of before #35 (the toolkit's bin/ and the system's, not the engine environment's) with
  no ninja-build installed (/usr/bin/ninja made inaccessible to the unit): the toolchain fails,
  naming the PATH;
- a SystemCallFilter= refusing pidfd_getfd: the syscalls part fails, naming it;
- a device node the service user may not open (a stand-in /dev/nvidia0, root's, mode 0600, with
  the numbers of /dev/fuse, which the machine lets root open): the devices part fails, naming the
  node and why. Not shown here: a node the unit's DevicePolicy= refuses (EPERM): systemd in
  this nspawn machine does not enforce DevicePolicy= (no BPF device cgroup; a node it should
  refuse opens), so that path is proven on a real box only.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import sandbox_sh
from tests.sandbox.test_unit_hardening import put

pytestmark = pytest.mark.sandbox
sh = sandbox_sh
UNIT = "glm-flash.service"
DROPIN = "/run/systemd/system/glm-flash.service.d/test-toolchain.conf"
OLD_ENV = "/run/glm-flash-test-old-path.env"
OLD_PATH = "/usr/local/cuda-12.8/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
STANDIN_NODE = "/dev/nvidia0"


def check() -> tuple[int, dict[str, dict]]:
    r = sh("glm-flash-gpu-check run --json", check=False, timeout=300)
    assert r.stdout.strip(), r.stderr
    return r.returncode, {p["part"]: p for p in json.loads(r.stdout.strip().splitlines()[-1])["parts"]}


@pytest.fixture
def dropin(sandbox):
    def write(text: str) -> None:
        put(DROPIN, "[Service]\n" + text)
        sh("systemctl daemon-reload")

    yield write
    sh(f"rm -f {DROPIN} {OLD_ENV} {STANDIN_NODE}; systemctl daemon-reload")


def test_the_deployed_unit_finds_ninja_and_compiles_through_its_toolkit(sandbox):
    rc, parts = check()
    assert rc == 0, parts
    env = sh(f"systemctl show -p EnvironmentFiles --value {UNIT}").stdout
    assert "/etc/glm-flash/glm-flash.env" in env
    # the engine environment's own ninja (pip's), first on the unit's PATH
    tc = parts["toolchain"]
    assert tc["state"] == "pass", tc
    assert (
        "at /opt/glm-flash/engine/current/bin/ninja; compiled a .cu through /usr/local/cuda-12.8/bin/nvcc"
        in (tc["detail"])
    ), tc
    assert parts["syscalls"]["state"] == "pass", parts["syscalls"]
    for name in ("devices", "cuda", "nccl"):
        assert parts[name]["state"] == "n/a" and "no NVIDIA GPU" in parts[name]["detail"], parts[name]
    # as the service user, not root: the probe's files are the transient unit's
    status = sh("glm-flash status --json", check=False)
    item = {it["item"]: it for it in json.loads(status.stdout)["items"]}["gpu check"]
    assert item["state"] == "n/a" and "toolchain: ninja" in item["detail"], item


def test_the_path_of_before_without_ninja_build_fails_naming_the_path(dropin):
    put(OLD_ENV, f"PATH={OLD_PATH}\n")
    # after the unit's own EnvironmentFile=, so its PATH wins; ninja-build's ninja out of the unit's reach
    dropin(f"EnvironmentFile={OLD_ENV}\nInaccessiblePaths=-/usr/bin/ninja\n")
    rc, parts = check()
    assert rc == 1, parts
    tc = parts["toolchain"]
    assert tc["state"] == "fail" and tc["detail"].startswith(f"ninja is not on the unit's PATH ({OLD_PATH})"), tc
    assert "flashinfer" in tc["detail"]


def test_a_syscall_the_filter_refuses_is_named(dropin):
    dropin("SystemCallFilter=~pidfd_getfd\n")
    rc, parts = check()
    assert rc == 1, parts
    sc = parts["syscalls"]
    assert sc["state"] == "fail" and "pidfd_getfd (Operation not permitted)" in sc["detail"], sc
    assert "SystemCallFilter" in sc["detail"]
    assert parts["toolchain"]["state"] == "pass"  # the rest of the check still runs


def test_a_device_node_the_service_user_may_not_open_is_named(dropin):
    # /dev/fuse's numbers: the machine lets root open it; root's, 0600: the service user may not
    sh(
        f"mknod -m 600 {STANDIN_NODE} c 10 229 && python3 -c \"import os; os.close(os.open('{STANDIN_NODE}', os.O_RDWR))\""
    )
    dropin("")
    rc, parts = check()
    assert rc == 1, parts
    dev = parts["devices"]
    assert dev["state"] == "fail", dev
    assert dev["detail"] == (
        f"not allowed to open {STANDIN_NODE} (Permission denied: its owner and mode do not let user glm-flash open it)"
    ), dev
