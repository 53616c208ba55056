"""files/glm-flash-gpu-check: its probe run as a subprocess with the system's python3, and the
properties it gives its transient unit, read from the real rendered engine unit.

Simulated: the toolkit (a stand-in nvcc that hands host code to the system's c++, as the real
one does; it compiles no device code) and the GPU (none here: the GPU parts are n/a, never a
pass). The probe's toolchain and syscall parts run for real; under the deployed unit's own
properties on the sandbox in tests/sandbox/test_engine_toolchain.py, and its GPU parts on a GPU
host in tests/host/test_service.py (`gpu`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from control.profile import build
from tests.unit.test_render import unit as render_unit

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "files" / "glm-flash-gpu-check"
# The PATH the unit set before #35: the toolkit's bin/ and the system's, not the engine's bin/.
OLD_PATH = "/usr/local/cuda-12.8/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NVCC = '#!/bin/sh\n# stand-in nvcc (TEST ONLY)\n[ "$1" = --version ] && { echo "release 12.8"; exit 0; }\nexec c++ -x c++ "$@"\n'


def tool_module():
    loader = importlib.machinery.SourceFileLoader("glm_flash_gpu_check", str(TOOL))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


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
