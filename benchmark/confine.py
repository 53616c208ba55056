"""Run a model's Python program confined: bubblewrap, an unprivileged user, limits (docs/eval.md).

Generated code is untrusted input that we execute, so it never runs as we do. Each program runs
as a fresh process tree under:

- `bwrap` (Debian's bubblewrap): new user, PID, network, IPC, UTS and cgroup namespaces
  (`--unshare-all`: only a loopback interface of its own, so no connection leaves it), the
  interpreter's directories read-only, an empty size-limited tmpfs as /tmp and working directory,
  nothing else of the host's file system, a cleared environment, `--die-with-parent`. It needs
  no privilege: an unprivileged user creates the user namespace (Debian allows it by default);
- `prlimit` (util-linux), inside the sandbox's user namespace: address space (`memory_mb`),
  processes (`NPROC`: a fork bomb gets EAGAIN), file size (`FSIZE`: the shared output file and
  the private /tmp), CPU time. Since Linux 5.14 the process count is per user namespace, so
  `NPROC` counts this item's processes only, whoever runs the eval;
- run as root, `setpriv` (util-linux) first drops to a user id of its own (`UID_BASE` + this
  process's id modulo a range, no passwd entry, no groups, no new privileges), so the sandbox's
  processes are not root's even outside their namespace.

The program comes on stdin (no file of ours is mounted in). A bootstrap prints a start marker
before it reads the program: output without it means the sandbox itself did not start (bwrap
could not fork, a limit hit before Python ran), which is never the program's fault. Such an item
is tried again (`ATTEMPTS`), and then the run stops with the reason: it is not scored as a
wrong answer. The program passes when it exits 0 and its last line of output is the nonce it
was given; the nonce is chosen per run and is not in the prompt, so a completion that exits
early with status 0 does not pass. At the wall-clock limit the whole tree is killed: bwrap's PID
namespace dies with its first process, taking every fork with it. This process is a child
subreaper (prctl PR_SET_CHILD_SUBREAPER), so that first process, which outlives the outer bwrap,
becomes our child and is reaped here: no zombie of an item waits for the machine's PID 1 (not
always a prompt reaper). The failure mode this guards against is a completion that damages or
reaches beyond the control machine; what it does not guard against is a kernel bug in namespaces.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass

UID_BASE = 2_000_000_000  # above systemd's container ranges (524288-1879048191), below 2^31
UID_SPAN = 1_000_000
NPROC = 64
FSIZE = 16 * 1024 * 1024
TMPFS = 64 * 1024 * 1024
ATTEMPTS = 3  # starts of one item's sandbox before the run stops
MISSING = (
    "bubblewrap (bwrap) or prlimit (and setpriv, run as root) is missing: generated code is only run "
    "confined. Install them with `apt install bubblewrap util-linux` (or `make deps`)"
)
PR_SET_CHILD_SUBREAPER = 36
# Run by the sandbox's Python before the program is even compiled: the start marker (argv[1]) says
# the sandbox came up; a program that does not compile is then the program's failure, not ours.
BOOT = (
    "import sys; sys.stdout.write(sys.argv[1] + '\\n'); sys.stdout.flush(); del sys.argv[1:]; "
    "exec(compile(sys.stdin.read(), '<program>', 'exec'), {'__name__': '__main__'})"
)


class ConfineError(Exception):
    """The confinement itself does not work here (not the program's fault)."""


@dataclass(frozen=True)
class Outcome:
    passed: bool
    reason: str  # empty when passed; else why, for the report
    seconds: float


def privileged() -> bool:
    return os.geteuid() == 0


def tools() -> dict[str, str]:
    """bwrap and setpriv from PATH; prlimit from /usr, which is all the sandbox sees of the host."""
    found = {t: shutil.which(t) for t in (("bwrap", "setpriv") if privileged() else ("bwrap",))}
    inside = shutil.which("prlimit", path="/usr/bin:/bin")
    found["prlimit"] = inside and os.path.realpath(inside)
    if not all(found.values()):
        raise ConfineError(MISSING)
    return found


def sandbox_uid() -> int:
    """The uid the sandbox's processes have outside their namespace: one of their own under root,
    else the caller's (who owns nothing the sandbox can see)."""
    return UID_BASE + os.getpid() % UID_SPAN if privileged() else os.getuid()


def _system_dirs(python: str) -> list[str]:
    """/usr read-only, the merged-/usr links as links (directories bound where not merged), and
    the interpreter's own prefix when it lives elsewhere."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    args += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    if not python.startswith("/usr/"):
        prefix = os.path.realpath(sys.base_prefix)
        args += ["--ro-bind", prefix, prefix]
    return args


def interpreter() -> str:
    """The system's python3 (Debian's, under /usr, readable by any user); else the base interpreter
    behind this venv, whose prefix is then bound (a prefix under root's 0700 home is refused by
    bwrap with "Permission denied", which self_check reports). The sandbox sees no venv."""
    system = shutil.which("python3", path="/usr/bin:/bin")
    if system:
        return os.path.realpath(system)
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def command(timeout_s: float, memory_mb: int, info_fd: int, started: str) -> list[str]:
    t = tools()
    python = interpreter()
    limits = [
        f"--as={memory_mb * 1024 * 1024}",
        f"--nproc={NPROC}",
        f"--fsize={FSIZE}",
        f"--cpu={int(timeout_s) + 1}",
        "--core=0",
    ]
    box = [
        "--unshare-all",
        "--die-with-parent",
        "--info-fd", str(info_fd),
        "--new-session",
        *_system_dirs(python),
        "--proc", "/proc",
        "--dev", "/dev",
        "--size", str(TMPFS), "--tmpfs", "/tmp",
        "--chdir", "/tmp",
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "HOME", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
    ]  # fmt: skip
    inner = [t["prlimit"], *limits, "--", python, "-I", "-c", BOOT, started]
    if not privileged():
        return [t["bwrap"], *box, *inner]
    uid = str(sandbox_uid())
    drop = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]
    return [t["setpriv"], *drop, "--", t["bwrap"], *box, *inner]


# The last line of a Python traceback: "ValueError: ...", "KeyboardInterrupt", "mod.Error: ...".
EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning|Iteration)\b")


def _reason(code: int | None, output: str) -> str:
    """The exception the program died of (the last traceback line; with many processes writing
    at once, the last line that looks like one), else its last line or exit status."""
    if len(output.encode()) >= FSIZE:
        return f"output larger than {FSIZE // (1024 * 1024)} MiB"
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if EXCEPTION.match(line)]
    last = (errors or lines or [""])[-1][:300]
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}" + (f" ({last})" if last else "")
    return last or f"exit status {code} without output"


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as f:
            return {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}
    except OSError:
        return {}


_subreaper = False


def _become_subreaper() -> None:
    """Orphans of our children become ours (not PID 1's), so _end_namespace can reap them."""
    global _subreaper
    if not _subreaper:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise ConfineError(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
        _subreaper = True


def _end_namespace(pid: int | None, wait_s: float = 10.0) -> None:
    """Kill the sandbox's PID 1 (bwrap's init inside, which outlives the outer bwrap) and reap it.
    Once the outer bwrap is gone, that init is our child (we are a subreaper) or already reaped;
    a pid that is not our child is left alone (it may be reused). The kernel makes a dying
    PID-namespace init wait for every other process of its namespace, so then none is left."""
    if pid is None:
        return
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if _status(pid).get("PPid") != str(os.getpid()):
            return  # reaped already (by bwrap), or not ours
        try:
            os.kill(pid, signal.SIGKILL)
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except (ProcessLookupError, ChildProcessError):
            return
        time.sleep(0.02)


class _NotStarted(Exception):
    pass


def run(program: str, timeout_s: float = 15.0, memory_mb: int = 1024) -> Outcome:
    """Run `program` confined; it passes when it ends by printing the nonce this adds. A sandbox
    that does not start is tried again; after ATTEMPTS the run stops (ConfineError)."""
    why = ""
    for attempt in range(ATTEMPTS):
        try:
            return _run_once(program, timeout_s, memory_mb)
        except _NotStarted as e:
            why = str(e)
            time.sleep(0.5 * 2**attempt)
    raise ConfineError(
        f"the sandbox did not start, {ATTEMPTS} times in a row ({why}); stopped rather than score that "
        "as the model's failure. Run the same command with the same OUT to go on"
    )


def _run_once(program: str, timeout_s: float, memory_mb: int) -> Outcome:
    _become_subreaper()
    started = f"glm-flash-eval-started-{uuid.uuid4().hex}"
    nonce = f"glm-flash-eval-passed-{uuid.uuid4().hex}"
    source = f"{program}\n\nprint({nonce!r})\n"
    info_r, info_w = os.pipe()  # bwrap writes {"child-pid": N} here: the sandbox's PID 1, as we see it
    cmd = command(timeout_s, memory_mb, info_w, started)
    with tempfile.TemporaryFile() as out:  # stdout and stderr; its size is capped by FSIZE
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=(info_w,),
            )
        finally:
            os.close(info_w)
        try:
            try:
                proc.stdin.write(source.encode())
                proc.stdin.close()
            except BrokenPipeError:
                pass
            code = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                code = proc.wait()
            with os.fdopen(info_r, "rb") as info:
                inner = _child_pid(info.read().decode("utf-8", "replace"))
            _end_namespace(inner)
        seconds = round(time.monotonic() - start, 3)
        out.seek(0)
        text = out.read(FSIZE + 1).decode("utf-8", "replace")
    before, marker, text = text.partition(started + "\n")
    if not marker:
        lines = [line for line in before.splitlines() if line.strip()]
        first = next((line for line in lines if line.startswith(("bwrap:", "setpriv:", "prlimit:"))), None)
        raise _NotStarted(first or (f"timed out after {timeout_s:g} s" if timed_out else f"exit status {code}"))
    if timed_out:
        return Outcome(False, f"timed out after {timeout_s:g} s", seconds)
    lines = text.rstrip("\n").splitlines()
    if code == 0 and lines and lines[-1] == nonce:
        return Outcome(True, "", seconds)
    if code == 0:
        return Outcome(False, "ended before its checks ran (exit status 0 without finishing)", seconds)
    return Outcome(False, _reason(code, text), seconds)


def _child_pid(info: str) -> int | None:
    m = re.search(r'"child-pid"\s*:\s*(\d+)', info)
    return int(m.group(1)) if m else None


def self_check() -> None:
    """Before any item: a trivial program must pass and one that fails must fail."""
    ok = run("x = 1", timeout_s=20)
    if not ok.passed:
        raise ConfineError(f"a trivial program does not run in the sandbox: {ok.reason}")
    bad = run("raise SystemExit(3)", timeout_s=20)
    if bad.passed:
        raise ConfineError("a failing program passed in the sandbox")
