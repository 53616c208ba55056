"""The deployed glm-flash.service under its sandboxing, on Debian 13's real systemd 257.

- `systemd-analyze security` rates the deployed unit at an exposure of 2.0 or less.
- Its start chain runs under the sandboxing: glm-flash-gpu.service is skipped (no NVIDIA
  driver here: simulated only by its absence), the service user's preflight runs and refuses
  for the GPU reason, and no step fails for a sandbox reason (systemd's 2xx exit statuses:
  namespace, seccomp, capabilities, state directory, credentials).
- A root step (`ExecStartPre=+`, as drop_page_cache uses) runs as root outside the service's
  mount namespace, so ProtectKernelTunables' read-only /proc/sys does not reach it; the
  service user's steps run inside it. nspawn mounts the sandbox's /proc/sys read-only for
  everyone, so the page-cache drop itself can only be shown on a real host
  (tests/host/test_service.py). The probe is a drop-in under /run, removed after.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REPO, sandbox_sh

pytestmark = pytest.mark.sandbox
UNIT = "glm-flash.service"
DROPIN = "/run/systemd/system/glm-flash.service.d/test-probe.conf"


def put(path: str, text: str) -> None:
    """Write a file on the sandbox (root's, through ssh's stdin)."""
    subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/ssh_config"), "sandbox", f"mkdir -p $(dirname {path}) && cat > {path}"],
        input=text,
        text=True,
        check=True,
        timeout=60,
    )


def exposure(unit: str = UNIT) -> float:
    out = sandbox_sh(f"systemd-analyze security --no-pager {unit}").stdout
    m = re.search(rf"Overall exposure level for {re.escape(unit)}: (\d+\.\d+)", out)
    assert m, out[-2000:]
    return float(m.group(1))


def start_and_log(timeout: int = 120) -> tuple[int, str, str]:
    """Start the unit from a clean state; (systemctl's exit code, this invocation's journal, its id)."""
    sandbox_sh(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}", check=False)
    start = sandbox_sh(f"timeout {timeout} systemctl start {UNIT}", check=False)
    inv = sandbox_sh(f"systemctl show -p InvocationID --value {UNIT}").stdout.strip()
    sandbox_sh(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}", check=False)
    # --sync: lines still queued in journald's stream socket are read in first (systemd >= 256)
    log = sandbox_sh(
        f"journalctl --sync; journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={inv} + INVOCATION_ID={inv}"
    ).stdout
    return start.returncode, log, inv


def test_exposure_is_at_most_2(sandbox):
    level = exposure()
    assert level <= 2.0, f"systemd-analyze security rates {UNIT} {level} (goal: <= 2.0)"


def test_start_chain_runs_under_the_sandboxing_and_fails_only_for_the_gpu(sandbox):
    rc, log, _ = start_and_log()
    assert rc != 0, "no GPU here: the start must fail"
    assert sandbox_sh("systemctl show -p ConditionResult --value glm-flash-gpu.service").stdout.strip() == "no"
    # the service user's preflight ran (inside the sandboxing) and gave the GPU reason
    assert "no NVIDIA driver on this host" in log and "cannot start" in log, log
    assert "status=1/FAILURE" in log, log
    assert not re.search(r"status=2\d\d/", log), log  # 2xx: systemd could not set the process up
    for problem in ("Permission denied", "Read-only file system", "Operation not permitted", "Bad system call"):
        assert problem not in log, log
    owner = sandbox_sh("stat -c '%U %a' /var/lib/glm-flash").stdout.split()
    assert owner == ["glm-flash", "750"], "StateDirectory= and the deploy agree on the state directory"


# mount options of /proc/sys in the caller's view (ro under ProtectKernelTunables=)
PROC_SYS = 'grep " /proc/sys " /proc/self/mountinfo | cut -d" " -f6'


@pytest.fixture
def probe():
    """A drop-in whose start steps report who they run as and what they see, then stop the start."""
    steps = [
        # root, as drop_page_cache's step
        "ExecStartPre=+/bin/sh -c 'echo probe-root uid=$$(id -u) procsys=$$(" + PROC_SYS + "); "
        "touch /etc/.glm-probe && echo probe-root-etc-writable; rm -f /etc/.glm-probe; "
        "test -e /tmp/.glm-probe-host && echo probe-root-host-tmp'",
        "ExecStartPre=/bin/sh -c 'echo probe-user uid=$$(id -u) procsys=$$(" + PROC_SYS + "); "
        "touch /var/lib/glm-flash/.probe && echo probe-user-state-writable; rm -f /var/lib/glm-flash/.probe; "
        "test -e /tmp/.glm-probe-host || echo probe-user-private-tmp; "
        "touch /run/lock/.glm-probe 2>&1 | sed s/^/probe-user-run-lock:/'",
        "ExecStartPre=/bin/false",
    ]
    put(DROPIN, "[Service]\nExecStartPre=\n" + "\n".join(steps) + "\n")
    sandbox_sh("touch /tmp/.glm-probe-host && systemctl daemon-reload")
    try:
        yield
    finally:
        sandbox_sh(f"rm -f {DROPIN} /tmp/.glm-probe-host && systemctl daemon-reload", check=False)


def test_root_steps_escape_the_sandboxing_user_steps_do_not(sandbox, probe):
    _, log, _ = start_and_log()
    root = re.search(r"probe-root uid=(\d+) procsys=(\S+)", log)
    user = re.search(r"probe-user uid=(\d+) procsys=(\S+)", log)
    assert root and user, log
    host_procsys = sandbox_sh('grep " /proc/sys " /proc/1/mountinfo | cut -d" " -f6').stdout.strip()
    service_uid = sandbox_sh("id -u glm-flash").stdout.strip()
    # `+`: root, the host's /proc/sys as it is (nspawn makes the sandbox's read-only; a real
    # host's is writable), the host's /etc and /tmp: none of the sandboxing applies
    assert root.groups() == ("0", host_procsys), log
    assert "probe-root-etc-writable" in log and "probe-root-host-tmp" in log, log
    # the service user: ProtectKernelTunables, PrivateTmp, ProtectSystem=strict with its state dir
    assert user.group(1) == service_uid and user.group(2).split(",")[0] == "ro"
    assert "probe-user-private-tmp" in log and "probe-user-state-writable" in log, log
    # /run/lock is world-writable (1777), read-only to the engine
    assert re.search(r"probe-user-run-lock:.*Read-only file system", log), log
    assert sandbox_sh("stat -c %a /run/lock").stdout.strip() == "1777"
