"""Toolkit role, command level: the commands for given facts.

Simulated: NVIDIA's apt repository and a GPU are not available here; the runfile path runs
for real against a stand-in in tests/sandbox/test_nvidia_sources.py, the driver-package
guard's shell in tests/sandbox/test_apt_hold_rootfs.py.
"""

import re

import fakehost
import pytest
from fakehost import F, FakeHost, Recorder, commands, on, refusal
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents

from control.profile import build
from roles import driver, toolkit
from roles.facts.driver import AptVersions, NvidiaPciDevices, PciDevice
from roles.facts.system import CudaToolkits
from roles.operations import apt_hold, packages
from roles.operations import driver as driver_ops
from roles.operations import toolkit as toolkit_ops

L40S = [PciDevice("0000:01:00.0", "0x26b9", "0x030200"), PciDevice("0000:41:00.0", "0x26b9", "0x030200")]
DEFAULTS = build("n", {}, api_key_present=False)
TOOL = "/opt/glm-flash/bin/glm-flash-nvidia-repo"
MARKER = F(FileContents, path="/usr/local/cuda-12.8/.glm-flash-runfile")


def profile(**data):
    return build("node1", data, api_key_present=False)


def simulate(monkeypatch, facts, prof):
    fake = FakeHost(facts)
    rec = Recorder(fake)
    rec.patch(monkeypatch, driver, apt_hold, toolkit)
    with on(fake):
        toolkit.apply(prof, "/opt/glm-flash/bin")
    return rec


def test_path_and_env_select_the_toolkit_by_path():
    p = profile()
    assert toolkit.toolkit_path(p) == "/usr/local/cuda-12.8"
    env = toolkit.toolkit_env(p)
    assert env["CUDA_HOME"] == "/usr/local/cuda-12.8"
    # the engine environment's bin/ (its pip ninja, which flashinfer's JIT runs by name), then nvcc's
    assert env["PATH"].startswith("/opt/glm-flash/engine/current/bin:/usr/local/cuda-12.8/bin:")
    assert "ninja-build" in p.base_packages and "build-essential" in p.base_packages
    assert "/usr/local/cuda/" not in env["PATH"] + "/" and not env["PATH"].startswith("/usr/local/cuda:")


def test_package_is_the_toolkit_not_the_driver_pulling_meta():
    assert toolkit_ops.toolkit_package("12.8") == "cuda-toolkit-12-8"
    assert toolkit_ops.toolkit_package("13.0") == "cuda-toolkit-13-0"


def test_toolkit_from_the_repository_when_it_carries_it(monkeypatch):
    facts = {
        DebPackages: {"nvidia-driver-cuda": {"590.48.01-1"}},
        MARKER: None,
        F(AptVersions, package="cuda-toolkit-12-8"): ["12.8.1-1"],
    }
    rec = simulate(monkeypatch, facts, profile())
    assert rec.calls[0][0] == "toolkit_installed"
    assert rec.calls[0][1] == [
        packages.UPDATE,
        "plan=$(apt-get -s install --no-install-recommends cuda-toolkit-12-8 | awk '/^(Inst|Remv) /{print $2}') && "
        "bad=$(printf '%s\\n' \"$plan\" | grep -E '" + driver_ops.DRIVER_PACKAGE_RE.pattern + "' || true) && "
        "if [ -n \"$bad\" ]; then echo \"glm-flash: cuda-toolkit-12-8 would change driver packages:\" $bad >&2; exit 1; fi",
        'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
        '-o Dpkg::Options::="--force-confold" -o DPkg::Lock::Timeout=600 install --no-install-recommends cuda-toolkit-12-8',
        'test -x /usr/local/cuda-12.8/bin/nvcc || { echo "glm-flash: cuda-toolkit-12-8 installed no '
        '/usr/local/cuda-12.8/bin/nvcc " >&2; exit 1; }',
    ]
    assert not any(c.split()[-1] in ("cuda", "cuda-12-8") for c in rec.all_commands)


def test_runfile_where_the_repository_has_no_such_toolkit(monkeypatch):
    """NVIDIA's debian13 repository carries no 12.x toolkit: the runfile, toolkit only, with
    libxml2 installed first (its installer links libxml2.so.2; spack-packages#5969 on debian:13)."""
    runfile = (
        f"{TOOL} runfile --url {DEFAULTS.cuda_runfile_url} --sha256 {DEFAULTS.cuda_runfile_sha256} "
        "--toolkitpath /usr/local/cuda-12.8"
    )
    facts = {DebPackages: {}, MARKER: None, F(AptVersions, package="cuda-toolkit-12-8"): []}
    rec = simulate(monkeypatch, facts, profile(require_gpu=False))
    assert rec.all_commands == [
        packages.UPDATE,
        'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
        '-o Dpkg::Options::="--force-confold" -o DPkg::Lock::Timeout=600 install --no-install-recommends libxml2',
        runfile,
    ]
    with_libxml2 = {**facts, DebPackages: {"libxml2": {"2.12.7+dfsg+really2.9.14-2.1"}}}
    assert commands(
        toolkit_ops.toolkit_installed,
        with_libxml2,
        cuda_version="12.8",
        tool=TOOL,
        runfile_url=DEFAULTS.cuda_runfile_url,
        runfile_sha256=DEFAULTS.cuda_runfile_sha256,
    ) == [runfile]
    args = dict(
        cuda_version="12.8",
        tool=TOOL,
        runfile_url=DEFAULTS.cuda_runfile_url,
        runfile_sha256=DEFAULTS.cuda_runfile_sha256,
    )
    # converged: the marker holds the runfile's sha256
    assert commands(toolkit_ops.toolkit_installed, {**facts, MARKER: [DEFAULTS.cuda_runfile_sha256]}, **args) == []
    # a different runfile pinned in the profile installs again
    assert commands(toolkit_ops.toolkit_installed, {**with_libxml2, MARKER: ["0" * 64]}, **args) == [runfile]


def test_installed_toolkit_changes_nothing(monkeypatch):
    facts = {DebPackages: {"cuda-toolkit-12-8": {"12.8.1-1"}}}
    assert simulate(monkeypatch, facts, profile()).all_commands == []


def test_preinstalled_toolkit_is_checked_not_installed(monkeypatch):
    gb10 = fakehost.gb10_box()
    facts = {
        NvidiaPciDevices: fakehost.GB10_BUS,
        CudaToolkits: {"13.0": "/usr/local/cuda-13.0"},
    }
    with pytest.MonkeyPatch.context() as first:  # undone before the second recorder patches
        assert simulate(first, facts, gb10).calls == [("toolkit_present", [])]
    facts[CudaToolkits] = {"12.8": "/usr/local/cuda-12.8"}
    assert simulate(monkeypatch, facts, gb10).calls == [("toolkit_present", ["function _fail_this_host"])]
    reason = refusal(toolkit_ops.toolkit_present, facts, cuda_version="13.0")
    assert re.search(r"node1: cuda_version: no CUDA 13.0 .*found: 12.8", reason)
