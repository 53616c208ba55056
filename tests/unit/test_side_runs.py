"""The runs beside a `make test` session (tests/conftest.py PytestRun): each in a session of its own,
interrupted as a terminal's Ctrl-C would, so its fixtures tear down, and killed with its whole
group when it does not end."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests import conftest

HELD = '''
import os, pathlib, subprocess, time
import pytest
@pytest.fixture
def held():
    child = subprocess.Popen(["sleep", "600"])  # a process of the run's group, as ssh or nspawn would be
    pathlib.Path(os.environ["SIDE_RUN_DIR"], "child").write_text(str(child.pid))
    yield
    pathlib.Path(os.environ["SIDE_RUN_DIR"], "torn-down").write_text("yes")
    child.kill()

def test_waits(held):
    pathlib.Path(os.environ["SIDE_RUN_DIR"], "started").write_text(str(os.getsid(0)))
    time.sleep(600)
'''

STUBBORN = '''
import os, pathlib, signal, subprocess, time

def test_ignores_interrupts():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen(["sleep", "600"])
    pathlib.Path(os.environ["SIDE_RUN_DIR"], "child").write_text(str(child.pid))
    pathlib.Path(os.environ["SIDE_RUN_DIR"], "started").write_text(str(os.getsid(0)))
    time.sleep(600)
'''


@pytest.fixture
def started(tmp_path):
    """Start a side run of `source`, once it runs its test; stopped at the end whatever the test found."""
    runs = []

    def start(source: str) -> conftest.PytestRun:
        test = tmp_path / "test_side.py"
        test.write_text(source)
        run = conftest.PytestRun("side", str(tmp_path / "side.log"), [str(test)], env={"SIDE_RUN_DIR": str(tmp_path)})
        run.start()
        runs.append(run)
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline and run.proc.poll() is None, (tmp_path / "side.log").read_text()
            time.sleep(0.1)
        return run

    yield start
    for run in runs:  # a test that failed before its stop(): nothing of it may outlive it
        if run.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)  # its group, when it leads one
            run.proc.kill()
            run.proc.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_side_run_is_a_session_of_its_own_and_an_interrupt_tears_it_down(tmp_path, started):
    run = started(HELD)
    assert int((tmp_path / "started").read_text()) == run.proc.pid != os.getsid(0)
    run.stop()
    run.stop()  # the session's end after an interrupt stops it again: nothing left to do
    assert (tmp_path / "torn-down").read_text() == "yes", (tmp_path / "side.log").read_text()
    assert run.proc.returncode == 2  # pytest's own exit status for an interrupted run
    assert not alive(int((tmp_path / "child").read_text()))


def test_a_side_run_that_ignores_the_interrupt_is_killed_with_its_group(tmp_path, started, monkeypatch):
    monkeypatch.setattr(conftest, "STOP_GRACE_S", 2)
    run = started(STUBBORN)
    child = int((tmp_path / "child").read_text())
    run.stop()
    assert run.proc.returncode == -9
    deadline = time.monotonic() + 10
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)  # the group went, not only its leader
