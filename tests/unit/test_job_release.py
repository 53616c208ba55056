"""files/glm-flash-job's wait for systemd to release a job's name, against a stand-in systemctl
(simulated: systemd itself; the sandbox's tests/sandbox/test_job.py runs the real one). The
stand-in models what two cold CI runs met: systemd keeps a stopped transient unit loaded
(`loaded inactive dead`, its notifier not running) until something makes it look again."""

from __future__ import annotations

import os
import stat
import sys

import pytest

from tests.conftest import REPO
from tests.unit.test_job_follow import load_job_tool

STANDIN = r"""#!/bin/sh
echo "$*" >> "$STATE/calls"
case "$1" in
  stop) n=$(cat "$STATE/stops" 2>/dev/null || echo 0); echo $((n + 1)) > "$STATE/stops" ;;
  show) printf 'Job=\nRefs=\nControlGroup=\nCollectMode=inactive\n' ;;
  list-units)
    case "$*" in
      *notify@*) echo "glm-flash-notify@glm-flash-job-x.service.service loaded inactive dead Word" ;;
      # held until systemd was asked again: the stops after the first (the caller's own)
      *) [ "$(cat "$STATE/stops" 2>/dev/null || echo 0)" -ge "$RELEASE_AFTER" ] || echo "glm-flash-job-x.service loaded inactive dead glm-flash job x" ;;
    esac ;;
esac
"""


@pytest.fixture
def job(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "systemctl"
    tool.write_text(STANDIN)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STATE", str(tmp_path))
    monkeypatch.syspath_prepend(str(REPO / "files"))
    module = load_job_tool()
    yield module, tmp_path
    sys.modules.pop("glm_flash_job", None)


def test_a_stopped_unit_systemd_keeps_is_asked_again_and_released(job, monkeypatch):
    module, state = job
    monkeypatch.setenv("RELEASE_AFTER", "1")
    assert module.released("x", timeout=20, poll=0.05, nudge_every=0.2) == ""
    calls = (state / "calls").read_text().splitlines()
    assert "stop glm-flash-job-x.service" in calls and "reset-failed glm-flash-job-x.service" in calls


def test_a_unit_still_held_at_the_end_is_refused_saying_what_systemd_holds(job, monkeypatch):
    module, _ = job
    monkeypatch.setenv("RELEASE_AFTER", "1000")
    held = module.released("x", timeout=0.5, poll=0.05, nudge_every=0.1)
    assert held.startswith("glm-flash-job-x.service loaded inactive dead")
    assert "Refs=" in held and "ControlGroup=" in held
    assert "its notifier: glm-flash-notify@glm-flash-job-x.service.service loaded inactive dead" in held
