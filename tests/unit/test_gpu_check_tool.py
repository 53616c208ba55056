"""files/glm-flash-gpu-check: its probe run as a subprocess with the system's python3, and the
properties it gives its transient unit, read from the real rendered engine unit.

Simulated: the toolkit (a stand-in nvcc that hands host code to the system's c++, as the real
one does; it compiles no device code) and the GPU (none here: the GPU parts are n/a, never a
pass). The probe's toolchain and syscall parts run for real; under the deployed unit's own
properties on the sandbox in tests/sandbox/test_engine_toolchain.py, and its GPU parts on a GPU
host in tests/host/test_service.py (`gpu`).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from control.profile import build
from tests.conftest import host_tool
from tests.unit.test_render import unit as render_unit

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "files" / "glm-flash-gpu-check"
# The PATH the unit set before #35: the toolkit's bin/ and the system's, not the engine's bin/.
OLD_PATH = "/usr/local/cuda-12.8/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVCC = '#!/bin/sh\n# stand-in nvcc (TEST ONLY)\n[ "$1" = --version ] && { echo "release 12.8"; exit 0; }\nexec c++ -x c++ "$@"\n'


def tool_module():
    return host_tool("glm-flash-gpu-check", "glm_flash_gpu_check")


def probe(env: dict) -> tuple[int, dict]:
    r = subprocess.run(
        [sys.executable, str(TOOL), "probe", "--ranks", "2", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.stdout.strip(), r.stderr
    return r.returncode, {p["part"]: p for p in json.loads(r.stdout)["parts"]}


@pytest.fixture
def toolkit(tmp_path):
    """A CUDA_HOME whose bin/nvcc is the stand-in, and an engine bin/ holding a ninja (as pip's)."""
    home = tmp_path / "cuda-12.8"
    (home / "bin").mkdir(parents=True)
    (home / "bin/nvcc").write_text(NVCC)
    (home / "bin/nvcc").chmod(0o755)
    engine_bin = tmp_path / "engine/current/bin"
    engine_bin.mkdir(parents=True)
    ninja = shutil.which("ninja")
    assert ninja, "ninja is missing on this machine (make deps installs ninja-build)"
    (engine_bin / "ninja").symlink_to(ninja)
    cc = Path(shutil.which("c++")).parent
    return home, engine_bin, cc


def test_ninja_on_the_path_compiles_through_the_toolkit(toolkit):
    home, engine_bin, cc = toolkit
    rc, parts = probe({"PATH": f"{engine_bin}:{home}/bin:{cc}", "CUDA_HOME": str(home)})
    assert parts["toolchain"]["state"] == "pass", parts
    assert f"at {engine_bin}/ninja; compiled a .cu through {home}/bin/nvcc" in parts["toolchain"]["detail"]
    assert parts["syscalls"]["state"] == "pass", parts
    # no GPU here: the GPU parts are n/a, not passed
    assert [parts[p]["state"] for p in ("devices", "cuda", "nccl")] == ["n/a"] * 3
    assert parts["cuda"]["detail"] == "no NVIDIA GPU on this host's PCI bus"
    assert rc == 0


def test_without_ninja_on_the_path_it_fails_naming_the_path(toolkit, tmp_path):
    """The unit's PATH of before: the toolkit and the system, neither holding a ninja."""
    home, _, cc = toolkit
    bare = tmp_path / "system-bin"  # the system's tools but no ninja (this machine has one in /usr/bin)
    bare.mkdir()
    for tool in ("c++", "sh"):
        (bare / tool).symlink_to(shutil.which(tool))
    rc, parts = probe({"PATH": f"{home}/bin:{bare}", "CUDA_HOME": str(home)})
    assert rc == 1
    assert parts["toolchain"]["state"] == "fail"
    assert parts["toolchain"]["detail"].startswith(f"ninja is not on the unit's PATH ({home}/bin:{bare})")


def test_a_toolkit_that_cannot_compile_fails_saying_so(toolkit):
    home, engine_bin, cc = toolkit
    (home / "bin/nvcc").write_text("#!/bin/sh\necho 'nvcc fatal   : Cannot find compiler cl.exe' >&2\nexit 1\n")
    rc, parts = probe({"PATH": f"{engine_bin}:{home}/bin:{cc}", "CUDA_HOME": str(home)})
    assert rc == 1 and parts["toolchain"]["state"] == "fail"
    assert "could not compile a .cu through" in parts["toolchain"]["detail"]
    assert "Cannot find compiler" in parts["toolchain"]["detail"]


def test_the_transient_unit_gets_the_engine_units_environment_not_its_commands(monkeypatch):
    """The properties handed to systemd-run: every [Service] line of the rendered unit (drop-ins
    after it, in order) but how it starts, stops and restarts."""
    profile = build("gpu1", {})
    unit = render_unit(profile, api_key=True)
    dropin = "[Service]\nDeviceAllow=\nDevicePolicy=strict\n"
    text = f"# /etc/systemd/system/glm-flash.service\n{unit}\n# /run/.../x.conf\n{dropin}"
    mod = tool_module()
    monkeypatch.setattr(mod.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, text, ""))
    props = mod.unit_properties("glm-flash.service")
    keys = [p.split("=", 1)[0] for p in props]
    for wanted in (
        "User=glm-flash",
        "EnvironmentFile=/etc/glm-flash/glm-flash.env",
        "LoadCredential=api-key:/etc/glm-flash/api-key",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia-uvm rw",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
    ):
        assert wanted in props, (wanted, props)
    assert any(p.startswith("SystemCallFilter=@system-service ") and "pidfd_getfd" in p for p in props)
    assert not {"Type", "ExecStart", "ExecStartPre", "ExecStartPost", "Restart", "RestartSec", "TimeoutStartSec"} & set(
        keys
    )
    assert "Description" not in keys and "OnFailure" not in keys  # [Unit] lines are not the service's
    assert props[-2:] == ["DeviceAllow=", "DevicePolicy=strict"]  # a drop-in's reset comes last, as systemd reads it


def test_the_unit_runs_the_probe_before_the_engine_starts():
    profile = build("gpu1", {})
    unit = render_unit(profile)
    pre = [line for line in unit.splitlines() if line.startswith("ExecStartPre=")]
    assert pre == [
        "ExecStartPre=/opt/glm-flash/bin/glm-flash-preflight gpus 2",
        "ExecStartPre=/opt/glm-flash/engine/current/bin/python /opt/glm-flash/bin/glm-flash-gpu-check probe --ranks 2",
    ]


# /proc/devices on a box with the NVIDIA driver loaded (its character majors; uvm's and caps' are
# given out dynamically, so their numbers differ from box to box).
PROC_DEVICES = """Character devices:
  1 mem
 10 misc
195 nvidia-frontend
195 nvidia-modeset
234 nvidia-uvm
237 nvidia-caps

Block devices:
  8 sd
"""


@pytest.fixture
def nvidia_nodes(tmp_path):
    """Device nodes with the driver's numbers (made here; nothing opens them) and its /proc/devices."""
    made = {}
    for name, major, minor in (("nvidia0", 195, 0), ("nvidiactl", 195, 255), ("nvidia-uvm", 234, 0), ("odd", 10, 229)):
        node = tmp_path / name
        os.mknod(node, 0o600 | stat.S_IFCHR, os.makedev(major, minor))
        made[name] = str(node)
    devices = tmp_path / "devices"
    devices.write_text(PROC_DEVICES)
    return made, str(devices)


def test_the_units_device_policy_is_read_against_each_nodes_numbers(nvidia_nodes):
    """What `run` adds to the devices part: systemd in a container (the sandbox) does not enforce
    DevicePolicy=, a real box does; so the unit's lines are read against the nodes as systemd
    resolves them."""
    nodes, devices = nvidia_nodes
    mod = tool_module()
    props = [line for line in render_unit(build("gpu1", {})).splitlines() if line.startswith("Device")]
    gpu = [nodes["nvidia0"], nodes["nvidiactl"], nodes["nvidia-uvm"]]
    assert mod.refused_by_policy(props, gpu, devices) == []  # the rendered unit allows the driver's nodes
    [why] = mod.refused_by_policy(props, [*gpu, nodes["odd"]], devices)
    assert why == (
        f"DevicePolicy=closed and its DeviceAllow= lines do not allow {nodes['odd']} (char 10:229, group misc): "
        "the engine gets EPERM opening them"
    )
    # a drop-in clearing the list and tightening the policy, as systemd reads it: nothing left
    [why] = mod.refused_by_policy([*props, "DeviceAllow=", "DevicePolicy=strict"], gpu, devices)
    assert why.startswith("DevicePolicy=strict and its DeviceAllow= lines do not allow ")
    assert f"{nodes['nvidia0']} (char 195:0, group nvidia-frontend/nvidia-modeset)" in why
    assert f"{nodes['nvidia-uvm']} (char 234:0, group nvidia-uvm)" in why
    # read-only is not enough; a path allows its own node; auto with no list allows all
    assert "nvidia-uvm" in mod.refused_by_policy(["DevicePolicy=closed", "DeviceAllow=char-nvidia* r"], gpu, devices)[0]
    assert mod.refused_by_policy(["DevicePolicy=closed", "DeviceAllow=char-nvidia* rw"], gpu, devices) == []
    assert (
        mod.refused_by_policy(["DevicePolicy=strict", f"DeviceAllow={nodes['odd']} rw"], [nodes["odd"]], devices) == []
    )
    assert mod.refused_by_policy(["DevicePolicy=auto"], [*gpu, nodes["odd"]], devices) == []
