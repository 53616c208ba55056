"""Kill a sandbox deploy at a named operation, as a dropped laptop lid or a Ctrl-C would.

pyinfra prints `--> Starting operation: <name>` before it runs an operation on the hosts.
`deploy_killed_at` watches for the first such line whose name contains `op`, waits `delay`
seconds (0: the operation has just begun; more: it is midway) and SIGKILLs pyinfra's whole
process group. The SSH connection dies with it, so the host sees what it sees when the
control machine vanishes: sshd hangs up on whatever the operation was running.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

from tests.conftest import REPO, SANDBOX_INVENTORY

# ANSI colours around the words; the name follows "operation:".
START = re.compile(r"Starting.*?operation:\S*\s+(?:\x1b\[[0-9;]*m)*(?P<name>.+?)(?:\x1b\[[0-9;]*m)*\s*$")


class NotReached(AssertionError):
    pass


def deploy_killed_at(op: str, delay: float = 0.0, *data: str, timeout: int = 3600, until=None) -> list[str]:
    """Run the sandbox deploy and kill it `delay` s after operation `op` starts (with `until`, a
    callable: once it returns, e.g. when a process of the operation runs on the host).

    pyinfra's output is read by a thread of its own the whole time, so while `until` waits the
    deploy never blocks on a full pipe (it would stall and the awaited process never start).
    Returns the operations started before the kill; raises NotReached if the deploy ended
    without starting `op` (a scenario that no longer reaches its kill point proves nothing).
    """
    args = [sys.executable, "-m", "pyinfra", "-y"]
    for d in data:
        args += ["--data", d]
    proc = subprocess.Popen(
        [*args, SANDBOX_INVENTORY, "deploy.py"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    started: list[str] = []
    reached = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = START.search(line)
            if m and not reached.is_set():
                started.append(m.group("name"))
                if op in m.group("name"):
                    reached.set()
        reached.set()  # the deploy ended: wake the waiter (it tells a reached op from an ended run)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        reached.wait(timeout)
        if started and op in started[-1]:
            if until is not None:
                until()
            time.sleep(delay)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            reader.join(30)
            return list(started)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    raise NotReached(f"the deploy ended (exit {proc.returncode}) without starting {op!r}; started: {started}")
