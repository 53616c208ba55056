"""The host suite's GPU checks are honest: not applicable only where no GPU belongs.

Run here: the host suite itself (tests/host/test_driver.py), as `make check` runs it, twice
against the deployed sandbox:
- as the sandbox is (no NVIDIA device on its PCI bus, require_gpu false): the GPU checks are
  reported not applicable, and the nouveau and metapackage checks, which need no GPU, run;
- as a GPU box whose driver did not load. Simulated: the profile requires GPUs (the
  inventory's entry with require_gpu: true) and an `nvidia-smi` stand-in in /usr/local/bin
  fails the way the real one does without its kernel module. Every GPU check must fail
  (not be skipped), naming the cause.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO, sandbox_sh
from tests.sandbox.test_unit_hardening import put

pytestmark = pytest.mark.sandbox
STANDIN = "/usr/local/bin/nvidia-smi"
# What nvidia-smi prints when the nvidia module is not loaded (its exit status is 9 then).
FAILING = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
exit 9
"""
GPU_CHECKS = ["test_driver_loaded_and_matches_userspace", "test_gpu_count_and_compute_capability"]


def host_suite(inventory: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable, "-m", "pytest", "tests/host/test_driver.py", "--no-deploy", "-p", "no:cacheprovider",
            "-rA", "--inventory", inventory, "--hosts", "ssh://sandbox", "--ssh-config", str(REPO / ".sandbox/ssh_config"),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_without_a_gpu_device_gpu_checks_are_not_applicable(sandbox):
    assert sandbox_sh("grep -lx 0x10de /sys/bus/pci/devices/*/vendor", check=False).stdout == ""
    r = host_suite("inventory/sandbox.py")
    assert r.returncode == 0, r.stdout[-4000:]
    for name in GPU_CHECKS:
        assert (
            f"PASSED tests/host/test_driver.py::{name}" not in r.stdout
            and f"FAILED tests/host/test_driver.py::{name}" not in r.stdout
        )
    assert "not applicable: no NVIDIA device on this host and require_gpu is false" in r.stdout, r.stdout[-3000:]
    assert "PASSED tests/host/test_driver.py::test_nouveau_not_loaded" in r.stdout, r.stdout[-3000:]
    assert "PASSED tests/host/test_driver.py::test_toolkit_install_did_not_pull_driver_metapackages" in r.stdout


def test_a_gpu_box_whose_driver_failed_fails_its_gpu_checks(sandbox, tmp_path):
    inventory = tmp_path / "gpu_box.py"
    inventory.write_text(
        "import runpy\n"
        f"base = runpy.run_path({str(REPO / 'inventory/sandbox.py')!r})['hosts']\n"
        "hosts = [(name, dict(data, require_gpu=True)) for name, data in base]\n"
    )
    put(STANDIN, FAILING)
    sandbox_sh(f"chmod 0755 {STANDIN}")
    try:
        r = host_suite(str(inventory))
    finally:
        sandbox_sh(f"rm -f {STANDIN}")
    assert r.returncode == 1, r.stdout[-4000:]
    for name in GPU_CHECKS:  # the marker fails them as they set up: pytest says ERROR, and exits 1
        assert re.search(rf"^(FAILED|ERROR) tests/host/test_driver.py::{name}\b", r.stdout, re.M), r.stdout[-4000:]
    assert "not applicable: no NVIDIA device" not in r.stdout, r.stdout[-4000:]
    assert "this host should have working GPUs (the profile sets require_gpu: true)" in r.stdout
    assert (
        "the nvidia kernel module is not loaded" in r.stdout
        and "couldn't communicate with the NVIDIA driver" in r.stdout
    )
