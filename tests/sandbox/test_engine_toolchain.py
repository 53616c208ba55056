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
- a device node the unit's DevicePolicy= refuses (a stand-in /dev/nvidia0 with the numbers of
  /dev/fuse, group misc): the devices part fails, naming the policy, the node, its numbers and
  its group. systemd in this nspawn machine does not enforce DevicePolicy= (no BPF device
  cgroup: the node opens), a real box does (EPERM); `run` reads the unit's lines against the
  node as systemd resolves them, so the sandbox shows what the real box would refuse;
- a device node the policy allows (a drop-in's DeviceAllow= naming it) but the service user may
  not open (root's, mode 0600): the devices part fails, naming the node and why;
- NCCL failing between the TP ranks. Simulated here, as no GPU is: an NVIDIA device on the PCI
  bus (a directory bound over /sys/bus/pci/devices in the check's own unit, vendor 0x10de, class
  0x0302 as an L40S), its device nodes (/dev/null's numbers, allowed by the drop-in) and a
  stand-in torch first on the unit's PYTHONPATH whose two sm_89 GPUs run the FP8 matmul (in
  Python) and whose NCCL fails as the real one does when the unit's /dev/shm is too small. The
  probe's own rank processes (spawned, under the unit's properties) meet it: the nccl part fails
  naming the ranks and NCCL's error, after devices and cuda passed.
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
GPU_STANDIN = "/run/glm-flash-test-gpu"
# The stand-in torch (TEST ONLY): what the probe's cuda and nccl parts call, no more.
STANDIN_TORCH = {
    "__init__.py": """import random as _random
from . import cuda, distributed, multiprocessing  # noqa: F401
float8_e4m3fn, bfloat16 = "float8_e4m3fn", "bfloat16"
class device:
    def __init__(self, kind, index=0):
        self.kind, self.index = kind, index
class Tensor:
    def __init__(self, rows):
        self.rows = rows
    def to(self, dtype):
        return self
    def float(self):
        return self
    def bfloat16(self):
        return self
    def t(self):
        return Tensor([list(c) for c in zip(*self.rows)])
    def __matmul__(self, other):
        cols = list(zip(*other.rows))
        return Tensor([[sum(a * b for a, b in zip(r, c)) for c in cols] for r in self.rows])
def randn(n, m, device=None):
    return Tensor([[_random.gauss(0, 1) for _ in range(m)] for _ in range(n)])
def ones(shape, device=None):
    return Tensor([[1.0]])
def _scaled_mm(a, b, scale_a, scale_b, out_dtype):
    return a @ b
def allclose(x, y, rtol, atol):
    return all(abs(p - q) <= atol + rtol * abs(q) for r, s in zip(x.rows, y.rows) for p, q in zip(r, s))
def full(shape, value, device=None):
    return [value] * shape[0]
""",
    "cuda.py": """def init(): pass
def device_count(): return 2
def get_device_capability(i): return (8, 9)
def synchronize(device=None): pass
def set_device(i): pass
""",
    "distributed.py": """class DistBackendError(RuntimeError): pass
def init_process_group(backend, init_method, rank, world_size, timeout): pass
def destroy_process_group(): pass
def all_reduce(t):  # the communicator is made at the first collective, as torch does it
    raise DistBackendError(
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error "
        "(run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\\nncclSystemError: System call (e.g. socket, "
        "malloc) or external library call failed or device error. \\nLast error:\\nError while creating shared "
        "memory segment /dev/shm/nccl-XBVhfH (size 9637888)")
""",
    "multiprocessing.py": "from multiprocessing import get_context  # noqa: F401\n",
}


def check(args: str = "") -> tuple[int, dict[str, dict]]:
    r = sh(f"glm-flash-gpu-check run --json {args}", check=False, timeout=300)
    assert r.stdout.strip(), r.stderr
    return r.returncode, {p["part"]: p for p in json.loads(r.stdout.strip().splitlines()[-1])["parts"]}


@pytest.fixture
def dropin(sandbox):
    def write(text: str) -> None:
        put(DROPIN, "[Service]\n" + text)
        sh("systemctl daemon-reload")

    yield write
    sh(f"rm -rf {DROPIN} {OLD_ENV} /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl {GPU_STANDIN}; systemctl daemon-reload")


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


@pytest.mark.parametrize(
    "mode,allow,detail",
    [
        # open to all: only the unit's DevicePolicy= stands in the way (this machine's systemd
        # enforces none, so the node opens here: the policy is named)
        (
            "666",
            "",
            f"DevicePolicy=closed and its DeviceAllow= lines do not allow {STANDIN_NODE} (char 10:229, group misc): "
            "the engine gets EPERM opening them",
        ),
        # the policy allows it (a drop-in names it), its owner and mode refuse the service user
        (
            "600",
            f"DeviceAllow={STANDIN_NODE} rw\n",
            f"not allowed to open {STANDIN_NODE} (Permission denied: its owner and mode do not let user glm-flash open it)",
        ),
    ],
    ids=["refused-by-the-units-policy", "refused-by-its-mode"],
)
def test_a_device_node_the_engine_may_not_open_is_named(dropin, mode, allow, detail):
    # /dev/fuse's numbers (group misc): the machine lets root open it
    sh(
        f"mknod -m {mode} {STANDIN_NODE} c 10 229 && "
        f"python3 -c \"import os; os.close(os.open('{STANDIN_NODE}', os.O_RDWR))\""
    )
    dropin(allow)
    rc, parts = check()
    assert rc == 1, parts
    dev = parts["devices"]
    assert dev["state"] == "fail", dev
    assert dev["detail"] == detail, dev


def test_nccl_failing_between_the_ranks_is_named(dropin):
    sh(f"mkdir -p {GPU_STANDIN}/python/torch {GPU_STANDIN}/pci/0000:01:00.0 && chmod -R a+rX {GPU_STANDIN}")
    for name, text in STANDIN_TORCH.items():
        put(f"{GPU_STANDIN}/python/torch/{name}", text)
    put(f"{GPU_STANDIN}/pci/0000:01:00.0/vendor", "0x10de\n")
    put(f"{GPU_STANDIN}/pci/0000:01:00.0/class", "0x030200\n")
    sh(f"chmod -R a+rX {GPU_STANDIN} && for n in nvidia0 nvidia1 nvidiactl; do mknod -m 666 /dev/$n c 1 3; done")
    dropin(
        f"Environment=PYTHONPATH={GPU_STANDIN}/python\n"
        f"BindReadOnlyPaths={GPU_STANDIN}/pci:/sys/bus/pci/devices\n"
        "DeviceAllow=/dev/nvidia0 rw\nDeviceAllow=/dev/nvidia1 rw\nDeviceAllow=/dev/nvidiactl rw\n"
    )
    rc, parts = check("--ranks 2")
    assert rc == 1, parts
    assert parts["devices"]["state"] == "pass", parts["devices"]  # the stand-in GPU is seen, its nodes open
    assert parts["cuda"] == {"part": "cuda", "state": "pass", "detail": "GPU 0 sm_89 fp8; GPU 1 sm_89 fp8"}, parts
    nccl = parts["nccl"]
    assert nccl["state"] == "fail" and nccl["detail"].startswith(
        "all-reduce over 2 ranks failed: rank 0: DistBackendError: "
    ), nccl
    assert "rank 1: DistBackendError: " in nccl["detail"], nccl
    assert "Error while creating shared memory segment /dev/shm/nccl-XBVhfH" in nccl["detail"], nccl
