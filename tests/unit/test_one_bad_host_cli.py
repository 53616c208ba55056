"""One bad host stops only itself (issue #10 item 6), through the real pyinfra CLI.

Two real hosts without a sandbox: `@local` and `@chroot//` (this machine again, through chroot,
which needs root, as the project's tests do). A small deploy runs the real refusal machinery
(pyinfra_ext/refusal.py) and the real GPU check (roles/operations/hardware.py, facts read from this
machine: no NVIDIA GPU here) and one harmless operation (`true`). One host is refused three ways:
from its facts at run time, by an operation that raises OperationError while it runs, and by a
role while the deploy is planned. Each time the other host runs its operations, the refused one
runs nothing after its refusal, the reason is printed and the exit status is non-zero.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from fakehost import FakeHost, on, refusal

from roles.facts.driver import NvidiaPciDevices, PciDevice
from roles.facts.system import Gpus
from roles.operations.hardware import gpus_match
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="@chroot// needs root")

DEPLOY = """
import os
from pyinfra import host
from pyinfra.api import OperationError, operation
from pyinfra.operations import server
from control import profile
from roles import hardware
from pyinfra_ext import refusal


@operation()
@refusal.refusing
def checked_at_run_time(refuse: bool):
    if refuse:
        raise OperationError(f"{host.name}: driver_min_version: 570 is older than 580. Fix: update the driver")
    host.noop("fine")
    yield from ()


p = profile.for_current_host()
with refusal.host_refusals():
    hardware.apply(p)
    server.shell(name="Planned before the refusal", commands=["true"])
    if os.environ["REFUSE_WHILE_PLANNING"] == host.name:
        profile.refuse("gpu_compute_capability", "the box is not what the profile says", "use the right profile")
    checked_at_run_time(name="Checked at run time", refuse=os.environ["RAISE_AT_RUN_TIME"] == host.name)
    server.shell(name="After the checks", commands=["true"])
"""
BAD = "@chroot//"


def run(tmp_path, bad_data=None, refuse_while_planning="", raise_at_run_time=""):
    inv = tmp_path / "inv.py"
    inv.write_text(
        f"hosts = [('@local', {{'require_gpu': False}}), ({BAD!r}, {bad_data or {'require_gpu': False}!r})]\n"
    )
    deploy = tmp_path / "deploy_two.py"
    deploy.write_text(DEPLOY)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        REFUSE_WHILE_PLANNING=refuse_while_planning,
        RAISE_AT_RUN_TIME=raise_at_run_time,
    )
    done = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "--json", str(inv), str(deploy)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    results = json.loads(done.stdout[done.stdout.index("{") :])["results"] if "{" in done.stdout else None
    return done, results


def outcome(results) -> dict[str, tuple[list, list]]:
    return {op["name"]: (op["success"] + op["no_change"], op["error"]) for op in results["operations"]}


def assert_only_the_bad_host_failed(done, results, failed_at: str, reason: str):
    err = done.stderr
    assert done.returncode == 1, err
    assert "Traceback" not in err, err
    refusal = re.search(rf"\[{re.escape(BAD)}\]\s+refused: {re.escape(BAD)}: {re.escape(reason)}", err)
    assert refusal, err
    assert results["failed_hosts"] == [BAD]
    ops = outcome(results)
    assert ops[failed_at][1] == [BAD], ops
    assert ops["After the checks"][0] == ["@local"], ops  # the good host ran to the end
    assert not re.search(rf"\[{re.escape(BAD)}\]\s+Success", err[refusal.end() :])  # nothing after its refusal


def test_facts_read_at_run_time_refuse_that_host_only(tmp_path):
    done, results = run(tmp_path, bad_data={"require_gpu": True, "gpu_count": 2})
    reason = "gpu_count: the profile expects 2 NVIDIA GPUs, the PCI bus shows 0. Fix:"
    assert_only_the_bad_host_failed(done, results, "GPUs are the profile's (count and compute capability)", reason)


def test_an_operation_error_at_run_time_refuses_that_host_only(tmp_path):
    done, results = run(tmp_path, raise_at_run_time=BAD)
    reason = "driver_min_version: 570 is older than 580. Fix: update the driver"
    assert_only_the_bad_host_failed(done, results, "Checked at run time", reason)


def test_a_refusal_while_planning_refuses_that_host_only(tmp_path):
    done, results = run(tmp_path, refuse_while_planning=BAD)
    reason = "gpu_compute_capability: the box is not what the profile says. Fix: use the right profile"
    assert_only_the_bad_host_failed(done, results, "Refused: nothing of the deploy is done on this host", reason)
    ops = outcome(results)
    # what was planned for it before the refusal is dropped: it ran nothing, the other host all
    assert ops["Planned before the refusal"] == (["@local"], [])
    assert ops["GPUs are the profile's (count and compute capability)"] == (["@local"], [])


def test_every_host_refused_ends_the_run_non_zero(tmp_path):
    done, results = run(tmp_path, bad_data={"require_gpu": True, "gpu_count": 2}, raise_at_run_time="@local")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert f"refused: {BAD}: gpu_count" in done.stderr and "refused: @local: driver_min_version" in done.stderr


def test_the_gpu_check_reads_its_facts_when_it_runs():
    """Facts in, command out: a refusal command on a mismatch, nothing when the GPUs match."""
    l40s_bus = [PciDevice(f"0000:0{i}:00.0", "0x26b9", "0x030200") for i in range(2)]
    reason = refusal(
        gpus_match,
        {Gpus: [], NvidiaPciDevices: l40s_bus[:1]},
        gpu_count=2,
        compute_capability="8.9",
        require_gpu=True,
    )
    assert reason == (
        "node1: gpu_count: the profile expects 2 NVIDIA GPUs, the PCI bus shows 1. "
        "Fix: fix the hardware or set gpu_count (and tp_size) to match; require_gpu: false for a test box"
    )
    fake = FakeHost({Gpus: [], NvidiaPciDevices: l40s_bus})
    with on(fake):
        assert list(gpus_match._inner(gpu_count=2, compute_capability="8.9", require_gpu=True)) == []
