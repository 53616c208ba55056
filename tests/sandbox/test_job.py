"""glm-flash-job on the deployed sandbox: real systemd-run units, a real SSH connection killed.

Nothing simulated: the jobs are small shell loops, run under the sandbox's systemd exactly as
the model download or an engine build would be.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import REPO, SANDBOX_INVENTORY, pyinfra, sandbox_sh

pytestmark = pytest.mark.sandbox
sh = sandbox_sh
RUNS = "/tmp/glm-flash-job-test"
RECORD = "/var/lib/glm-flash-notify/last-failure.json"  # glm-flash-notify's word on the last failure
NOTIFIER = "glm-flash-notify@glm-flash-job-test-fast.service.service"


def own_connection(command: str) -> subprocess.Popen:
    """An SSH connection of its own (no multiplexing): killing this client drops that connection."""
    return subprocess.Popen(
        ["ssh", "-F", str(REPO / ".sandbox/ssh_config"), "-o", "ControlMaster=no", "-o", "ControlPath=none", "sandbox"]
        + [command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(command: str, timeout: float = 30) -> None:
    end = time.monotonic() + timeout
    while sh(command, check=False).returncode != 0:
        assert time.monotonic() < end, f"timed out waiting for: {command}"
        time.sleep(0.5)


def job(name: str, script: str) -> str:
    return f"glm-flash-job run {name} -- sh -c '{script}'"


@pytest.fixture
def clean():
    names = ("test-survive", "test-other", "test-op", "test-fast", "test-held")
    units = " ".join(f"glm-flash-job-{n}.service" for n in names)
    sh(f"systemctl stop {units}; systemctl reset-failed {units}; rm -rf {RUNS}; mkdir {RUNS}; true")
    yield
    sh(f"systemctl stop {units}; systemctl reset-failed {units}; rm -rf {RUNS}; true")


def test_job_survives_a_dropped_connection_and_a_second_run_attaches(sandbox, clean):
    # The job runs until the test lets it end (the go file), not for a time a loaded machine might outlast.
    cmd = job(
        "test-survive",
        f"echo started >> {RUNS}/runs; for i in 1 2 3 4 5 6 7 8; do echo tick $i; done; "
        # It keeps writing while it waits: a follower whose connection dropped notices on its next write.
        f"while [ ! -e {RUNS}/go ]; do echo waiting; sleep 0.2; done; exit 7",
    )
    first = own_connection(cmd)
    wait_for(f"test -s {RUNS}/runs")
    first.kill()  # the connection drops as with a network failure; sshd hangs up the session
    first.wait()
    # The follower went with the session; the unit did not.
    wait_for("! pgrep -f 'glm-flash-job run test-surviv[e]'")
    assert sh("systemctl is-active glm-flash-job-test-survive.service", check=False).stdout.strip() == "active"

    # The second run's stderr to a file there: it says when the run has attached, then the job may end.
    second = own_connection(f"{cmd} 2> {RUNS}/second.err")
    wait_for(f"grep -q 'already running: attaching' {RUNS}/second.err")
    sh(f"touch {RUNS}/go")
    out, _ = second.communicate(timeout=120)
    err = sh(f"cat {RUNS}/second.err").stdout
    assert second.returncode == 7, err
    assert "glm-flash-job-test-survive.service is already running: attaching" in err
    assert "tick 8" in out.splitlines()
    assert "failed with exit status 7" in err
    assert sh(f"cat {RUNS}/runs").stdout == "started\n"  # started once, not twice
    status = json.loads(sh("glm-flash-job status test-survive --json").stdout)
    assert (status["state"], status["exit_status"]) == ("ended", 7)
    invocation = "$(systemctl show -p InvocationID --value glm-flash-job-test-survive.service)"
    log = sh(f"journalctl _SYSTEMD_INVOCATION_ID={invocation} -o cat --no-pager").stdout.splitlines()
    assert [line for line in log if line.startswith("tick")] == [f"tick {i}" for i in range(1, 9)]


def test_success_progress_and_a_different_command_under_the_same_name(sandbox, clean):
    cmd = (
        f"glm-flash-job run test-other --watch {RUNS}/data --every 1 -- sh -c "
        f"'mkdir -p {RUNS}/data; for i in 1 2 3 4; do head -c 1048576 /dev/zero > {RUNS}/data/f$i; done; "
        f"while [ ! -e {RUNS}/go ]; do sleep 0.1; done'"
    )
    running = own_connection(cmd)
    wait_for("systemctl is-active glm-flash-job-test-other.service")
    other = sh(job("test-other", "exit 0"), check=False)
    assert other.returncode == 2
    assert "glm-flash-job-test-other.service is running a different command" in other.stderr
    sh(f"touch {RUNS}/go")  # refused while it ran; now it may end
    out, err = running.communicate(timeout=60)
    assert running.returncode == 0, err
    assert "[test-other] 4.0 MiB in 4 files under /tmp/glm-flash-job-test/data" in out
    assert "glm-flash-job-test-other.service finished" in err
    status = json.loads(sh("glm-flash-job status test-other --json").stdout)
    assert (status["state"], status["exit_status"]) == ("ended", 0)
    # A new run of a finished job starts it again.
    again = sh(job("test-other", "echo again"), check=False)
    assert again.returncode == 0 and again.stdout == "again\n", again.stderr


def test_a_command_that_ended_before_journald_read_its_output_still_shows_it(sandbox, clean):
    """journald reads a unit's output stream when it gets to it; on a busy host a short command has
    ended by then, and its lines carry no _SYSTEMD_INVOCATION_ID (journald finds none for a gone
    process). A cold CI run lost a failing job's lines that way. Here journald is frozen
    (SIGSTOP, resumed after 3 s) while the job runs and fails, so that happens every time."""
    journald = sh("systemctl show -p MainPID --value systemd-journald.service").stdout.strip()
    assert journald.isdigit() and journald != "0"
    sh(f"rm -f {RECORD}")
    r = sh(
        f"(sleep 3; kill -CONT {journald}) & kill -STOP {journald}; "
        + job("test-fast", "echo fast-line-one; echo fast-line-two; exit 3"),
        check=False,
    )
    assert r.returncode == 3, r.stderr
    assert r.stdout.splitlines() == ["fast-line-one", "fast-line-two"], (r.stdout, r.stderr)
    # What made it hard: the lines are in the journal under the unit, without the invocation's id.
    fields = sh("journalctl -o json -u glm-flash-job-test-fast.service MESSAGE=fast-line-one").stdout
    assert "_SYSTEMD_INVOCATION_ID" not in fields, "journald read the stream in time: the case was not made"
    # Its failure word too (glm-flash-notify@, which systemd started the moment it failed, while
    # journald was still frozen): the record holds the lines that say why.
    wait_for(f"grep -q glm-flash-job-test-fast {RECORD} && ! systemctl is-active -q '{NOTIFIER}'")
    lines = json.loads(sh(f"cat {RECORD}").stdout)["lines"]
    assert [line.split("]: ", 1)[-1] for line in lines if "sh[" in line] == ["fast-line-one", "fast-line-two"], lines


def test_the_operation_streams_the_job_and_fails_only_on_its_exit_status(sandbox, clean):
    r = pyinfra(SANDBOX_INVENTORY, "tests/sandbox/job_deploy.py", timeout=300)
    assert r.returncode != 0, r.stderr
    assert "[sandbox] op-line-one" in r.stderr and "[sandbox] op-line-two" in r.stderr, r.stderr
    assert "op-line" not in r.stdout  # streamed to stderr: stdout stays pyinfra's (JSON with --json)
    assert (
        "job test-op did not succeed: glm-flash-job: glm-flash-job-test-op.service failed with exit status 3. "
        "Log: journalctl -u glm-flash-job-test-op.service"
    ) in r.stderr
    assert sh(f"cat {RUNS}/op").stdout == "ran\n"


def test_a_run_right_after_a_failure_waits_for_its_notifier_to_release_the_name(sandbox, clean):
    """A failed job starts its failure notifier (OnFailure=glm-flash-notify@), which holds the failed
    unit loaded while it runs: until it ends, systemd refuses a new unit of that name ("already
    loaded or has a fragment file"). On a loaded CI run an engine build's retry met exactly that.
    Here the notifier is held (a drop-in that waits for a file) so the case happens every time:
    the next run waits, says why, and starts once the notifier has ended."""
    held = "glm-flash-notify@glm-flash-job-test-held.service.service"
    release = f"{RUNS}/release"
    dropin = f"/run/systemd/system/{held}.d"
    sh(
        f"mkdir -p {dropin} && printf '%s\\n' '[Service]' "
        f"\"ExecStartPre=/bin/sh -c 'while [ ! -e {release} ]; do sleep 0.2; done'\" > {dropin}/hold.conf "
        "&& systemctl daemon-reload"
    )
    try:
        r = sh(job("test-held", "exit 3"), check=False)
        assert r.returncode == 3, r.stderr
        wait_for(f"[ \"$(systemctl show -p ActiveState --value '{held}')\" = activating ]")  # held
        again = own_connection(job("test-held", f"echo ran-again >> {RUNS}/again"))
        waited = []
        for line in again.stderr:
            waited.append(line)
            if "waiting for systemd to release the previous glm-flash-job-test-held.service" in line:
                break
        else:
            again.wait(timeout=60)
            pytest.fail(f"the second run did not wait for the notifier: {''.join(waited)}")
        sh(f"touch {release}")
        out, err = again.communicate(timeout=120)
        assert again.returncode == 0, "".join(waited) + err
        assert sh(f"cat {RUNS}/again").stdout == "ran-again\n"
    finally:
        sh(f"touch {release}; rm -rf {dropin}; systemctl daemon-reload; true")
