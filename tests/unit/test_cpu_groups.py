"""The CPU split of a whole run (tests/conftest.py cpu_groups, in_cpu_group): the session's chain
weighs more than the runs beside it, where a cgroup v1 cpu controller is ours to write."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import CPU_GROUP, CPU_ROOT, CPU_SHARES, cpu_groups, in_cpu_group


def test_groups_are_made_with_their_shares_under_a_v1_cpu_root(tmp_path):
    (tmp_path / "cpu.shares").write_text("1024\n")  # what a cgroup v1 cpu controller's root holds
    groups = cpu_groups(tmp_path)
    assert set(groups) == set(CPU_SHARES) and CPU_SHARES["session"] > CPU_SHARES["side"]
    for name, procs in groups.items():
        assert procs == tmp_path / CPU_GROUP / name / "cgroup.procs"
        assert (procs.parent / "cpu.shares").read_text().strip() == str(CPU_SHARES[name])
    assert cpu_groups(tmp_path) == groups  # a second run (or a second checkout) finds them made


def test_no_groups_where_the_root_is_no_v1_cpu_controller(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu io memory\n")  # cgroup v2: no cpu.shares
    assert cpu_groups(tmp_path) == {}
    assert not (tmp_path / CPU_GROUP).exists()


def test_the_command_itself_is_moved_before_it_runs(tmp_path):
    procs = tmp_path / "cgroup.procs"
    procs.write_text("")
    out = subprocess.run(in_cpu_group(procs, ["sh", "-c", "echo $$"]), capture_output=True, text=True, check=True)
    assert procs.read_text().split() == [out.stdout.strip()]  # the pid that ran the command, nothing else
    assert in_cpu_group(None, ["true"]) == ["true"]


def test_a_failed_move_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    cmd = in_cpu_group(tmp_path / "absent" / "cgroup.procs", ["touch", str(marker)])
    assert subprocess.run(cmd, capture_output=True).returncode != 0
    assert not marker.exists()


def test_on_this_machine_a_side_command_lands_in_the_side_group():
    groups = cpu_groups()
    if not groups:
        pytest.skip(f"not applicable: no writable cgroup v1 cpu controller at {CPU_ROOT} (the split is off here)")
    out = subprocess.run(in_cpu_group(groups["side"], ["cat", "/proc/self/cgroup"]), capture_output=True, text=True)
    cpu = [line for line in out.stdout.splitlines() if line.split(":")[1].split(",").count("cpu")]
    assert cpu and cpu[0].endswith(f"/{CPU_GROUP}/side"), out.stdout
    assert Path(groups["side"]).parent.joinpath("cpu.shares").read_text().strip() == str(CPU_SHARES["side"])
