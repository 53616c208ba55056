"""Shared fixtures: which inventory the run targets, and the sandbox deploy.

`pytest tests` targets the built-in sandbox: it boots a bare Debian 13 machine, deploys
twice and keeps both runs' pyinfra JSON results for the tests. Against a real host:
`pytest tests/host --inventory inventory/l40s.py [--inventory-host gpu1]` (no deploy): the host,
its address, port, user, key, known_hosts and `_sudo` come from the inventory, as the deploy
reaches it (`--hosts` still overrides them).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SANDBOX_INVENTORY = "inventory/sandbox.py"

from control.layout import HOST_MODULE  # noqa: E402  (REPO on sys.path first)


def pytest_addoption(parser):
    parser.addoption("--inventory", default=SANDBOX_INVENTORY, help="inventory file whose profile the host checks use")
    parser.addoption("--no-deploy", action="store_true", help="check the sandbox as it is, without deploying first")
    parser.addoption(
        "--inventory-host", default="", help="which host of --inventory to check (when it has more than one)"
    )


def targets_sandbox(config) -> bool:
    """True when the run checks the built-in sandbox (decided once, before --hosts is filled in)."""
    if not hasattr(config, "_glm_flash_sandbox"):
        config._glm_flash_sandbox = config.getoption("--inventory") == SANDBOX_INVENTORY and not config.getoption(
            "hosts", None
        )
    return config._glm_flash_sandbox


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; reported not applicable where the host has none")
    config.addinivalue_line("markers", "sandbox: deploys to the built-in Debian 13 sandbox")
    config.addinivalue_line(
        "markers", "serving: needs the engine serving: a GPU node, or an engine that needs none (gpu_count 0)"
    )
    if targets_sandbox(config):
        # testinfra reaches the sandbox through the ssh_config `make sandbox-up` writes.
        config.option.hosts = "ssh://sandbox"
        config.option.ssh_config = str(REPO / ".sandbox" / "ssh_config")
    elif not config.getoption("hosts", None) and config.getoption("--inventory") != SANDBOX_INVENTORY:
        name, ssh_config, sudo = inventory_target(config.getoption("--inventory"), config.getoption("--inventory-host"))
        config.option.hosts, config.option.ssh_config = f"ssh://{name}", ssh_config
        config.option.sudo = config.option.sudo or sudo


# pyinfra's ssh connector keys and the ssh_config options they are.
SSH_OPTIONS = {
    "ssh_hostname": "HostName",
    "ssh_port": "Port",
    "ssh_user": "User",
    "ssh_key": "IdentityFile",
    "ssh_known_hosts_file": "UserKnownHostsFile",
    "ssh_strict_host_key_checking": "StrictHostKeyChecking",
}


def inventory_target(path: str, wanted: str) -> tuple[str, str, bool]:
    """(host name, an ssh_config that reaches it as the deploy does, whether to sudo) for the one
    host of inventory `path` (or `wanted` of several)."""
    import tempfile

    entries = inventory_hosts(path)
    names = [name for name, _ in entries]
    if wanted:
        if wanted not in names:
            raise pytest.UsageError(f"{wanted!r} is not a host of {path} (it has: {', '.join(names)})")
        entries = [e for e in entries if e[0] == wanted]
    elif len(entries) != 1:
        raise pytest.UsageError(f"{path} has {len(entries)} hosts; name one: make check INVENTORY={path} HOST=<name>")
    name, data = entries[0]
    lines = [f"Host {name}"]
    for key, option in SSH_OPTIONS.items():
        value = data.get(key)
        if value is None:
            continue
        if key in ("ssh_key", "ssh_known_hosts_file"):
            value = (REPO / Path(str(value)).expanduser()).resolve()
        lines.append(f"  {option} {value}")
    if "ssh_key" in data:
        lines.append("  IdentitiesOnly yes")
    folder = tempfile.mkdtemp(prefix="glm-flash-check-")
    ssh_config = Path(folder) / "ssh_config"
    ssh_config.write_text("\n".join(lines) + "\n")
    return name, str(ssh_config), data.get("_sudo") is True


def inventory_hosts(path: str) -> list[tuple[str, dict]]:
    old = os.getcwd()
    os.chdir(REPO)
    try:
        return runpy.run_path(str(REPO / path))["hosts"]
    finally:
        os.chdir(old)


def host_tool(name: str, module: str):
    """files/NAME (a host tool: no .py suffix) loaded as the Python module MODULE. A tool that imports
    glm_flash_host needs files/ on sys.path (the caller's monkeypatch or sys.path)."""
    loader = importlib.machinery.SourceFileLoader(module, str(REPO / "files" / name))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(module, loader))
    loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def reachable_dir(prefix: str, mode: int = 0o755):
    """A fresh directory under /tmp that other users reach (pytest's tmp_path is root's, 0700), for
    what a test runs as another user; removed after."""
    top = Path(tempfile.mkdtemp(prefix=prefix))
    top.chmod(mode)
    try:
        yield top
    finally:
        shutil.rmtree(top)


def installed_tool(top: Path, name: str) -> Path:
    """files/NAME and the shared host module copied into `top`, as install_root/bin holds them."""
    for each in (name, HOST_MODULE):
        shutil.copy(REPO / "files" / each, top / each)
    return top / name


def pyinfra(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def sandbox_sh(command: str, check: bool = True, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run a shell command on the built-in sandbox (its ssh_config); check=True fails the test on a non-zero exit."""
    r = subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/ssh_config"), "sandbox", command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and r.returncode:
        raise AssertionError(f"{command}: {r.stdout}{r.stderr}{start_failure(command)}")
    return r


def start_failure(command: str) -> str:
    """For a failed `systemctl start/restart UNIT`: what systemd says of the unit and what PID 1 logged
    last (a result such as `resources` is told there only), so a failure seen once can be read."""
    units = re.findall(r"systemctl (?:re)?start ([\w@.:-]+)", command)
    if not units:
        return ""
    said = sandbox_sh(
        "; ".join(f"systemctl status --no-pager -l -n 0 {u}; journalctl -q --no-pager -n 30 -u {u}" for u in units)
        + "; journalctl -q --no-pager -n 30 _PID=1",
        check=False,
        timeout=60,
    )
    return f"\n--- what systemd says ---\n{said.stdout}{said.stderr}"


def journal_end(sh=sandbox_sh) -> str:
    """The cursor of the host journal's last entry now ("" when empty): run_log reads what comes after."""
    out = sh("journalctl -q -n1 -o json --output-fields=MESSAGE").stdout.strip()
    return json.loads(out)["__CURSOR"] if out else ""


def run_log(unit: str, invocation: str, after: str, sh=sandbox_sh) -> str:
    """One run's journal lines, written after the cursor `after`: the run's output and systemd's words
    about it. Its output is read by the unit's name, keeping lines of this invocation or of none:
    journald tags no _SYSTEMD_INVOCATION_ID on the lines of a command that ended before it read
    them (a launcher that refuses at once, on a busy host), so a read by the id alone can miss them."""
    sh("journalctl --sync")
    fields = "MESSAGE,_SYSTEMD_INVOCATION_ID,INVOCATION_ID"
    since = f"--after-cursor={shlex.quote(after)}" if after else ""
    out = sh(f"journalctl -q --no-pager -o json --output-fields={fields} -u {unit} {since}").stdout
    lines = []
    for entry in map(json.loads, out.splitlines()):
        if entry.get("_SYSTEMD_INVOCATION_ID", entry.get("INVOCATION_ID", invocation)) == invocation:
            text = entry.get("MESSAGE")
            lines.append(bytes(text).decode("utf-8", "replace") if isinstance(text, list) else str(text or ""))
    return "\n".join(lines)


def service_last_start(unit: str = "glm-flash.service") -> tuple[float, str]:
    """(InactiveExitTimestamp as epoch seconds to the microsecond, InvocationID) of the unit's last start.

    `--timestamp=unix` rounds down to the second, so a start in the same second as a file change
    would look older than it; the deploy's own fact reads microseconds, and so does this.
    """
    from roles.facts.service import ServiceStartState  # the deploy's own parser (the repo is on sys.path by now)

    show = f"systemctl show --timestamp=us+utc -p InactiveExitTimestamp -p InvocationID {unit}"
    lines = sandbox_sh(show).stdout.splitlines()
    invocation = next((line.partition("=")[2] for line in lines if line.startswith("InvocationID=")), "")
    return ServiceStartState.parse(lines).last_start, invocation


def changed_operations(result_json: str) -> list[str]:
    """Names of operations that changed or failed anything, from `pyinfra --json` output."""
    results = json.loads(result_json)["results"]["operations"]
    return [op["name"] for op in results if op["success"] or op["error"]]


class Deploys:
    def __init__(self, first: subprocess.CompletedProcess, second: subprocess.CompletedProcess):
        self.first, self.second = first, second


# The directories that need no sandbox run first (in this order), the ones that check it last
# (served last: it deploys the CPU engine onto the session's sandbox and leaves it serving). The
# session's sandbox is built and deployed in the background meanwhile (SandboxBuild), so a unit
# failure shows in minutes and the cold build overlaps the tests that do not need it. In a run
# with other tests, tests/fleet and tests/served run beside the session (fleet(), served()).
ORDER = ["unit", "bench", "cuda", "engine", "eval", "gb10", "fleet", "host", "sandbox", "served"]


def top_dir(path) -> str:
    """The directory under tests/ a test file lives in ("" for tests/ itself)."""
    path = Path(path) if Path(path).is_absolute() else REPO / path
    parts = path.resolve().relative_to(REPO / "tests").parts
    return parts[0] if len(parts) > 1 else ""


def pytest_collection_modifyitems(session, config, items):
    if os.environ.get("GLM_FLASH_BACKGROUND_RUN"):  # the background pytest: BACKGROUND's order
        items.sort(key=lambda item: len(BACKGROUND) if background_rank(item) is None else background_rank(item))
        return
    rank = {d: i for i, d in enumerate(ORDER)}
    items.sort(key=lambda item: rank.get(top_dir(item.path), len(ORDER)))  # stable: order within a directory kept


class SandboxBuild:
    """`sandbox.py fresh`, the session's two deploys and `sandbox.py snapshot` (the deployed machine
    kept, which tests/fleet boots on), in a thread started once the run's tests are known;
    sandbox_deploys() joins it. `fresh`'s output goes to .sandbox-build.log (not to whichever
    test is running meanwhile), and a failure shows its tail. A session that ends before it is
    joined (-x, an interrupt) stops it: no deploy runs on after pytest. `then`: called with its
    error ("" when it built) when it has ended (what waits for the build: the fleet's tests, the
    served tests' own sandbox)."""

    def __init__(self, then=None):
        self.then = then
        self.log = REPO / ".sandbox-build.log"
        self.first = self.second = None
        self.error = ""
        self.seconds = 0.0
        self.proc: subprocess.Popen | None = None
        self.stopped = False
        self.thread = threading.Thread(target=self._run, name="sandbox-build", daemon=True)

    def _step(self, args: list[str], log) -> subprocess.CompletedProcess:
        if self.stopped:
            raise RuntimeError("stopped: the session ended")
        out = log if log else subprocess.PIPE
        self.proc = subprocess.Popen(
            args, cwd=REPO, stdout=out, stderr=out if log else subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )  # fmt: skip
        stdout, stderr = self.proc.communicate()
        return subprocess.CompletedProcess(args, self.proc.returncode, stdout or "", stderr or "")

    def _run(self) -> None:
        began = time.monotonic()
        deploy = [sys.executable, "-m", "pyinfra", "-y", "--json", SANDBOX_INVENTORY, "deploy.py"]
        try:
            with open(self.log, "w") as log:
                fresh = self._step([sys.executable, str(REPO / "sandbox/sandbox.py"), "fresh"], log)
            if fresh.returncode != 0:
                self.error = f"sandbox.py fresh failed ({fresh.returncode}):\n{self.log.read_text()[-6000:]}"
                return
            self.first = self._step(deploy, None)
            if self.first.returncode != 0:
                self.error = f"first deploy failed:\n{self.first.stderr[-6000:]}"
                return
            self.second = self._step(deploy, None)
            if self.second.returncode != 0:
                self.error = f"second deploy failed:\n{self.second.stderr[-6000:]}"
                return
            # the deployed machine kept: the fleet boots on it while the session's tests use the sandbox
            with open(self.log, "a") as log:
                kept = self._step([sys.executable, str(REPO / "sandbox/sandbox.py"), "snapshot"], log)
            if kept.returncode != 0:
                self.error = f"sandbox.py snapshot failed ({kept.returncode}):\n{self.log.read_text()[-6000:]}"
        except Exception as e:  # reported by sandbox_deploys(), in the test that needs it
            self.error = f"the sandbox build raised {type(e).__name__}: {e}"
        finally:
            self.seconds = time.monotonic() - began
            if self.then is not None and not self.stopped:
                self.then(self.error)

    def result(self) -> Deploys:
        self.thread.join()
        assert not self.error, self.error
        return Deploys(self.first, self.second)

    def stop(self) -> None:
        self.stopped = True
        if self.thread.is_alive() and self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.thread.join(timeout=60)


def needs_sandbox(session) -> bool:
    config = session.config
    if not targets_sandbox(config) or config.getoption("--no-deploy"):
        return False
    return any("sandbox_deploys" in item.fixturenames or top_dir(item.path) == "fleet" for item in session.items)


# Tests that need no sandbox of the session's, or run on machines of their own: the arm64 root
# (emulated aarch64 code on one core for minutes: mmdebstrap, uv, the downloader), tests/cuda's
# glibc 2.41 root, tests/gb10 and tests/engine (real wheels installed into venvs), the GB10 sandbox,
# the sandbox tool's own checkouts, the apt-hold root. In a run that has other tests too, they run
# in a pytest of their own beside the session, started with it, so their minutes overlap the
# session's: the sandbox build then the tests on it, which keep about one of the two cores busy
# (the unit, bench and eval tests stay in front: they fail fast). The session joins it at its end:
# its result and durations are in the summary ("background"), and its failure fails the session.
# A test of these that needs the session's sandbox (the `sandbox` fixture) stays in the session:
# the background pytest builds no sandbox. Run alone, they run as any test does. In this order (a
# module, or every module under a directory): the arm64 module first, it is the longest.
BACKGROUND = [
    "tests/gb10/test_downloader_arm64.py",
    "tests/cuda/",
    "tests/gb10/",
    "tests/engine/",
    "tests/sandbox/test_gb10_sandbox.py",
    "tests/sandbox/test_sandbox_tool.py",
    "tests/sandbox/test_apt_hold_rootfs.py",
]
SESSION_FIXTURES = {"sandbox", "sandbox_deploys"}
BACKGROUND_ENV = {"GLM_FLASH_BACKGROUND_RUN": "1"}  # its pytest sorts its items in BACKGROUND's order


def background_rank(item) -> int | None:
    """The place of `item`'s module in BACKGROUND (the first entry naming it), None when none does."""
    rel = Path(item.path).resolve().relative_to(REPO).as_posix()
    for i, entry in enumerate(BACKGROUND):
        if rel == entry or (entry.endswith("/") and rel.startswith(entry)):
            return i
    return None


class PytestRun:
    """A pytest of its own beside the session, over `nodeids`, its output in `log`; started by start()
    (now, or when the sandbox build has ended), joined at the session's end."""

    def __init__(self, label: str, log: str, nodeids: list[str], args: tuple = (), env: dict | None = None):
        self.label, self.nodeids, self.args, self.env = label, nodeids, list(args), env or {}
        self.log = REPO / log
        self.seconds = 0.0
        self.proc: subprocess.Popen | None = None
        self.skipped = ""  # why it never started
        self.cpu: Path | None = None  # the cgroup.procs it runs in (cpu_split), None: the session's
        self.waiter = threading.Thread(target=self._wait, name=label, daemon=True)

    def start(self, error: str = "") -> None:
        """Start it, unless `error` (the sandbox build's, which it needs) says why it cannot run."""
        if error:
            self.skipped = "not run: the sandbox build failed (the session's first sandbox test shows why)\n"
            self.log.write_text(self.skipped)
            return
        self.began = time.monotonic()
        with open(self.log, "w") as log:
            pytest_args = ["-p", "no:cacheprovider", "--durations=10", *self.args, *self.nodeids]
            self.proc = subprocess.Popen(
                in_cpu_group(self.cpu, [sys.executable, "-m", "pytest", *pytest_args]),
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                env=dict(os.environ, PYTHONUNBUFFERED="1", **self.env),
            )  # fmt: skip
        # its own time, taken when it ends (the session joins it only at its own end)
        self.waiter.start()

    def _wait(self) -> None:
        self.proc.wait()
        self.seconds = time.monotonic() - self.began

    @property
    def returncode(self) -> int | None:
        return 1 if self.skipped else None if self.proc is None else self.proc.returncode

    def join(self) -> int:
        if self.proc is None:  # never started: the build failed, or the session ended first
            return 1
        self.waiter.join()
        return self.proc.returncode

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# tests/served: in a run that has other tests too, on a sandbox of its own beside the session. A
# copy of this checkout (.sandbox/served-checkout: its own machine, ports and hub, as a second clone
# would have) boots a bare machine and runs them there with --no-deploy: their first deploy is the
# CPU inventory's onto that bare machine, `make demo`'s own path. Started once the session's sandbox
# is built (the first minutes are the build's), joined at the session's end like the background
# pytest, its machine destroyed after it. Run alone (`pytest tests/served`), they run in the session
# on its sandbox, after the L40S deploys.
SERVED = "served"
_TOP_LEVEL_SKIP = {".git", ".venv", ".venv-bench", ".sandbox", ".pytest_cache", ".ruff_cache", "bench", "eval"}


class CheckoutRun:
    label = "served tests, on a sandbox of their own"

    def __init__(self, nodeids: list[str]):
        self.nodeids = nodeids
        self.root = REPO / ".sandbox" / "served-checkout"
        self.log = REPO / ".served-tests.log"
        self.returncode: int | None = None
        self.seconds = 0.0
        self.proc: subprocess.Popen | None = None
        self.stopped = False
        self.cpu: Path | None = None  # the cgroup.procs its steps run in (cpu_split), None: the session's
        self.thread = threading.Thread(target=self._run, name="served-tests", daemon=True)
        # its own ports (a second clone picks its own): none of this checkout's pinned ones
        self.env = {k: v for k, v in os.environ.items() if not k.endswith("_PORT") or not k.startswith("GLM_FLASH_")}
        self.env["PYTHONUNBUFFERED"] = "1"

    def _step(self, args: list[str], log) -> int:
        self.proc = subprocess.Popen(
            in_cpu_group(self.cpu, args),
            cwd=self.root,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env,
        )
        return self.proc.wait()

    def _copy(self, log) -> None:
        if (self.root / "sandbox" / "sandbox.py").exists():  # a run before this one left its machine
            self._step([sys.executable, "sandbox/sandbox.py", "destroy"], log)
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.copytree(
            REPO,
            self.root,
            symlinks=True,
            ignore=lambda d, names: [
                n
                for n in names
                if (Path(d) == REPO and (n in _TOP_LEVEL_SKIP or n.endswith(".log"))) or n == "__pycache__"
            ],
        )

    def _run(self) -> None:
        began = time.monotonic()
        rc = 1
        try:
            with open(self.log, "w") as log:
                self._copy(log)
                if not self.stopped:
                    rc = self._step([sys.executable, "sandbox/sandbox.py", "fresh"], log)
                if rc == 0 and not self.stopped:
                    pytest_args = ["-p", "no:cacheprovider", "--no-deploy", "--durations=10", *self.nodeids]
                    rc = self._step([sys.executable, "-m", "pytest", *pytest_args], log)
                self._step([sys.executable, "sandbox/sandbox.py", "destroy"], log)  # its disk back
            shutil.rmtree(self.root, ignore_errors=True)
        except Exception as e:  # told in the summary, and the session fails
            with open(self.log, "a") as log:
                log.write(f"the served run raised {type(e).__name__}: {e}\n")
            rc = 1
        finally:
            self.seconds = time.monotonic() - began
            self.returncode = rc

    def start(self, error: str = "") -> None:
        """Started whether the session's build succeeded or not (`error`): it builds a machine of its own."""
        self.thread.start()

    def join(self) -> int:
        if self.thread.ident is None:  # never started (the session ended first)
            return 1
        self.thread.join()
        return self.returncode if self.returncode is not None else 1

    def stop(self) -> None:
        self.stopped = True
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # pytest ends its tests; the destroy step still runs
        if self.thread.ident is not None:
            self.thread.join(timeout=300)


def served(session) -> None:
    """Move tests/served into a CheckoutRun when other tests remain and the session deploys its own
    sandbox (with --no-deploy they run against the sandbox as it is)."""
    config = session.config
    if not targets_sandbox(config) or config.getoption("--no-deploy"):
        return
    moved = [item for item in session.items if top_dir(item.path) == SERVED]
    if not moved or len(moved) == len(session.items):
        return
    config._glm_flash_served = CheckoutRun([item.nodeid for item in moved])
    session.items[:] = [item for item in session.items if item not in moved]


def background(session) -> None:
    """Move the items of BACKGROUND's modules that need no session sandbox into a pytest of their own,
    when others remain (pytest_collection_finish starts it)."""
    moved = [
        item
        for item in session.items
        if background_rank(item) is not None and not SESSION_FIXTURES & set(item.fixturenames)
    ]
    if not moved or len(moved) == len(session.items):
        return
    run = PytestRun("background tests", ".background-tests.log", [item.nodeid for item in moved], env=BACKGROUND_ENV)
    session.config._glm_flash_background = run
    session.items[:] = [item for item in session.items if item not in moved]


# tests/fleet: in a run that builds the session's sandbox and has other tests too, in a pytest of
# their own started once it is built (and kept as a snapshot, sandbox.py snapshot): the fleet's
# machines boot on that snapshot, each on an upper layer of its own, while tests/host and
# tests/sandbox check the single sandbox beside them. The fleet has its own addresses (its subnet,
# sandbox/fleet.py) and its own stand-in hub and log; the NVIDIA stand-in they share is read-only.
FLEET = "fleet"


def fleet(session) -> None:
    moved = [item for item in session.items if top_dir(item.path) == FLEET]
    if not moved or len(moved) == len(session.items) or not needs_sandbox(session):
        return
    session.config._glm_flash_fleet = PytestRun(
        "fleet tests, on the sandbox's snapshot", ".fleet-tests.log", [item.nodeid for item in moved], ("--no-deploy",)
    )
    session.items[:] = [item for item in session.items if item not in moved]


# CPU for the run's longest path. On CI's 2 cores the session's chain (the sandbox build, then
# tests/host and tests/sandbox on it) sets the run's length; the runs beside it end minutes before
# it. With the CPU shared evenly the chain waits behind them while the CPU is full, then runs alone
# on a half-idle machine: a cold run of 9d608fc used 52 core-minutes in 33 minutes, most of its last
# 9 idle. Where the cgroup v1 cpu controller is there and writable (root on CI's machine), the
# session and all it starts (its sandbox's machine too: nspawn's processes stay in the caller's cpu
# group) run with CPU_SHARES["session"], the runs beside it and their machines with
# CPU_SHARES["side"]: the chain is served first while the CPU is full, the side runs take the rest.
# Elsewhere (cgroup v2, not root) nothing changes; the summary says which.
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
CPU_GROUP = "glm-flash-tests"
CPU_SHARES = {"session": 2048, "side": 1024}


def cpu_groups(root: Path = CPU_ROOT) -> dict[str, Path]:
    """{name: its cgroup.procs} for CPU_SHARES' groups under root/CPU_GROUP, made now; {} when root
    is not a cgroup v1 cpu controller this process may write."""
    if not (root / "cpu.shares").is_file() or not os.access(root, os.W_OK):
        return {}
    groups = {}
    try:
        top = root / CPU_GROUP
        top.mkdir(exist_ok=True)
        for name, shares in CPU_SHARES.items():
            (top / name).mkdir(exist_ok=True)
            (top / name / "cpu.shares").write_text(f"{shares}\n")
            groups[name] = top / name / "cgroup.procs"
    except OSError:
        return {}
    return groups


def in_cpu_group(procs: Path | None, cmd: list[str]) -> list[str]:
    """`cmd`, moved into the cgroup whose cgroup.procs is `procs` before it runs (as it is for None).
    A shell writes its own pid, then execs: nothing of cmd runs before the move."""
    if procs is None:
        return cmd
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *cmd]


def cpu_split(config) -> None:
    """With runs beside the session: the session into the "session" group, each side run's `cpu` the
    "side" group (cpu_groups); the summary says what was done."""
    runs = side_runs(config)
    groups = cpu_groups() if runs else {}
    if groups:
        groups["session"].write_text(f"{os.getpid()}\n")
        for run in runs:
            run.cpu = groups["side"]
    config._glm_flash_cpu = groups


def pytest_collection_finish(session):
    if session.config.getoption("collectonly"):
        return
    background(session)
    build_needed = needs_sandbox(session)  # before tests/fleet leave the session
    fleet(session)
    served(session)
    config = session.config
    cpu_split(config)
    if getattr(config, "_glm_flash_background", None) is not None:
        config._glm_flash_background.start()
    after = [
        run for run in (getattr(config, "_glm_flash_fleet", None), getattr(config, "_glm_flash_served", None)) if run
    ]
    if build_needed:
        config._glm_flash_build = build = SandboxBuild(then=lambda error: [run.start(error) for run in after])
        build.thread.start()
    else:
        for run in after:
            run.start()


def side_runs(config) -> list:
    """The runs beside the session: the background pytest, the fleet's, the served tests' own sandbox."""
    names = ("_glm_flash_background", "_glm_flash_fleet", "_glm_flash_served")
    return [run for run in (getattr(config, name, None) for name in names) if run is not None]


def pytest_sessionfinish(session, exitstatus):
    stopping = session.shouldstop or session.shouldfail or exitstatus == pytest.ExitCode.INTERRUPTED
    build = getattr(session.config, "_glm_flash_build", None)
    if build is not None:
        if stopping:
            build.stop()
        else:
            build.thread.join()  # the runs it starts have started, or never will
    for run in side_runs(session.config):
        if stopping:
            run.stop()  # -x or an interrupt: nothing runs on after pytest
        if run.join() != 0 and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def sandbox_deploys(request) -> Deploys | None:
    """Deploy a fresh sandbox twice (once per test session); None when targeting another host."""
    config = request.config
    if not targets_sandbox(config) or config.getoption("--no-deploy"):
        return None
    build = getattr(config, "_glm_flash_build", None)
    if build is None:  # a test that needs it was not foreseen at collection: build now
        build = config._glm_flash_build = SandboxBuild()
        build.thread.start()
    return build.result()


def pytest_unconfigure(config):
    build = getattr(config, "_glm_flash_build", None)
    if build is not None:
        build.stop()


# Where the time goes: every run prints each directory's share (setup, call and teardown of its
# tests, so the fixtures' deploys count where they run) and the background sandbox build's.
_WALL: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    _WALL[top_dir(report.fspath) or "tests"] += report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _WALL:
        return
    terminalreporter.section("time per directory")
    for name in sorted(_WALL, key=lambda d: ORDER.index(d) if d in ORDER else len(ORDER)):
        terminalreporter.write_line(f"{name:>10}  {_WALL[name] / 60:6.1f} min")
    groups = getattr(config, "_glm_flash_cpu", None)
    if groups:
        shares = ", ".join(f"{name} {n}" for name, n in CPU_SHARES.items())
        terminalreporter.write_line(f"(cpu shares, cgroup v1 {CPU_ROOT / CPU_GROUP}: {shares})")
    elif groups is not None and side_runs(config):
        terminalreporter.write_line(f"(cpu shares: even; no writable cgroup v1 cpu controller at {CPU_ROOT})")
    build = getattr(config, "_glm_flash_build", None)
    if build is not None and build.seconds:
        terminalreporter.write_line(f"{'(sandbox build, in the background)':>10}  {build.seconds / 60:6.1f} min")
    for run in side_runs(config):
        if run.returncode is None:
            continue
        terminalreporter.write_line(f"{'(' + run.label + ')':>10}  {run.seconds / 60:6.1f} min")
        out = run.log.read_text(errors="replace").splitlines()
        failed = run.returncode != 0
        modules = " ".join(dict.fromkeys(nodeid.split("::")[0] for nodeid in run.nodeids))
        terminalreporter.section(f"{run.label}: {modules}: {'FAILED' if failed else 'passed'}")
        # a failure: its report; a pass: its durations and its result line
        result = [line for line in out if line[:1].isdigit() or (line.startswith("=") and " in " in line)]
        for line in out[-200:] if failed else result:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def sandbox(request, sandbox_deploys) -> bool:
    """The built-in sandbox is the target and has been deployed (now, or before with --no-deploy)."""
    if not targets_sandbox(request.config):
        pytest.skip("not applicable: needs the built-in sandbox")
    return True
