"""The engine on the Debian 13 sandbox, for real: the uploaded CPython 3.11, the pinned
0.7.0.post1 environment built offline from the real PyPI wheels (torch CUDA build and all),
then an upgrade to the real 0.7.0.post4 lock beside it (first killed while its environment is
built: the kill test of #21 rides on this build, the only one CI always does from scratch), a
failed upgrade that must leave `current` alone, and a rollback.

No GPU here: what needs the driver (sgl_kernel's CUDA ops, starting the service) is shown
failing for exactly that reason; everything else imports and runs.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import pytest

from control.engine_lock import fetch, load_lock, pin_of
from tests.conftest import (
    SANDBOX_INVENTORY,
    changed_operations,
    journal_end,
    pyinfra,
    run_log,
    sandbox_sh,
    service_last_start,
    targets_sandbox,
)
from tests.sandbox.killpoints import deploy_killed_at

pytestmark = pytest.mark.sandbox
ROOT = "/opt/glm-flash"  # install_root of inventory/sandbox.py
ENGINE = f"{ROOT}/engine"
PY = f"{ENGINE}/current/bin/python"
UV = f"{ROOT}/tools/uv"  # the deploy's (layout.host_uv): the environments' one builder
UPGRADE_SET = "0.7.0.post4"


def sh(command: str, check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
    return sandbox_sh(command, check=check, timeout=timeout)


def deploy(*data: str) -> subprocess.CompletedProcess:
    args = ["--json"]
    for d in data:
        args += ["--data", d]
    return pyinfra(*args, SANDBOX_INVENTORY, "deploy.py", timeout=3600)


def state() -> dict:
    return json.loads(sh(f"{ROOT}/bin/glm-flash-engine status --json").stdout)


@pytest.fixture(scope="module")
def deployed(request, sandbox_deploys):
    if not targets_sandbox(request.config):
        pytest.skip("not applicable: these tests deploy the built-in sandbox only")
    return sandbox_deploys  # None with --no-deploy: the sandbox is checked as it is


@pytest.fixture(scope="module")
def base_env(deployed) -> str:
    s = state()
    assert s["current"] and s["current"].startswith("0.7.0.post1-"), s
    return s["current"]


@pytest.fixture(scope="module")
def no_upgrade_env_yet(base_env) -> None:
    """The upgrade below must build the new set for real: an environment of it left by an earlier
    run (tests/sandbox/test_kill_points.py builds one when it runs first, for its switch kills) is removed, with the
    `previous` link to it, by the host's own prune (it keeps only current and previous)."""
    s = state()
    if any(k.startswith(UPGRADE_SET + "-") for k in s["envs"]):
        if s["previous"] and s["previous"].startswith(UPGRADE_SET + "-"):
            sh(f"rm {ENGINE}/previous")
        sh(f"{ROOT}/bin/glm-flash-engine prune")
    assert not any(k.startswith(UPGRADE_SET + "-") for k in state()["envs"]), state()


def test_engine_ops_ran_once_and_second_deploy_changed_nothing(deployed):
    if deployed is None:
        pytest.skip("ran with --no-deploy")
    first = changed_operations(deployed.first.stdout)
    assert any(op.startswith("Engine environment 0.7.0.post1-") for op in first)
    assert any(op.startswith("Interpreter cpython-3.11") for op in first)
    assert any(op.startswith("Switch engine current -> 0.7.0.post1-") for op in first)
    assert changed_operations(deployed.second.stdout) == []


def test_interpreter_is_the_uploaded_cpython_311_with_its_libraries(base_env):
    out = sh(
        f"{PY} -I -c 'import sys, ssl, sqlite3, ctypes, lzma; print(sys.version.split()[0], sys.base_prefix)'"
    ).stdout
    version, prefix = out.split()
    assert version.startswith("3.11.") and prefix.startswith(f"{ROOT}/python/cpython-3.11")
    # relocated: no RUNPATH into the control machine's tree, sysconfig points at the host copy
    assert "/root/.pyenv" not in sh(f"{PY} -I -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])'").stdout
    assert sh(f"ldd {prefix}/bin/python3.11 | grep -c 'not found'", check=False).stdout.strip() == "0"
    assert sh("python3 -c 'import sys; print(sys.version_info[:2])'").stdout.strip() == "(3, 13)"  # Debian's own stays


def test_uv_pip_check_reports_only_the_intended_conflicts(base_env):
    """The lock's two overrides (docs/sources.md §2, §3): cuDNN over torch's pin, and the field
    report's transformers-kt over sglang-kt's; nothing else (the installer's own check, on stderr)."""
    r = sh(f"cd /tmp && {UV} pip check --no-config --python {PY}", check=False)
    lines = sorted(line for line in r.stderr.splitlines() if line.startswith("The package `"))
    assert r.returncode == 1 and len(lines) == 2, r.stderr
    assert lines[0].startswith("The package `sglang-kt` requires `transformers-kt==5.6.0.post3`"), r.stderr
    assert "but `5.6.0.post4` is installed" in lines[0], r.stderr
    assert (
        lines[1].startswith("The package `torch` requires `nvidia-cudnn-cu12==9.10.2.21") and "`9.16.0.29`" in lines[1]
    )


def test_engine_imports_without_a_gpu(base_env):
    code = (
        "import torch, transformers, kt_kernel, sglang, sglang.srt.server_args, sglang.launch_server, "
        "xgrammar, flashinfer, triton; "
        "print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch.backends.cudnn.version(), "
        "transformers.__version__, kt_kernel.__version__)"
    )
    out = sh(f"cd /tmp && {PY} -W ignore -c {shlex.quote(code)}").stdout.split()
    assert out[:4] == ["2.9.1+cu128", "12.8", "False", "91600"]  # torch sees cuDNN 9.16 (sglang wants >= 9.15)
    assert (
        out[4] == "5.6.0.post4"
    )  # transformers-kt's version string (the report's, docs/sources.md §2), not upstream 5.15.1
    assert out[5] == "0.7.0.post1"
    # sgl_kernel's CUDA ops need the driver's libcuda.so.1: that, and only that, is missing here
    r = sh(f"cd /tmp && {PY} -c 'import sgl_kernel'", check=False)
    assert r.returncode != 0 and "libcuda.so.1" in r.stderr


def test_transformers_kt_is_the_last_writer_of_transformers(base_env):
    report = json.loads(sh(f"{ROOT}/bin/glm-flash-engine verify {base_env} --json").stdout)
    assert report["owners"]["transformers"] == {
        "owner": "transformers-kt",
        "files_not_from_owner": 0,
        "also_installed": "5.15.1",
    }
    assert report["cudnn"] == "9.16.0.29" and report["problems"] == []


def test_cudnn_drift_is_put_back_by_the_next_deploy(deployed, base_env):
    """Someone removes cuDNN from the env by hand (a real uninstall): the deploy re-asserts it."""
    if deployed is None:
        pytest.skip("ran with --no-deploy")
    _, pins = load_lock("0.7.0.post1")
    sh(f"cd /tmp && {UV} pip uninstall -q --python {PY} nvidia-cudnn-cu12")
    assert state()["cudnn"] is None
    run = deploy()
    assert run.returncode == 0, run.stderr[-4000:]
    want = pin_of(pins, "nvidia-cudnn-cu12").version
    assert changed_operations(run.stdout) == [f"nvidia-cudnn-cu12=={want} in {base_env}"]
    assert state()["cudnn"] == want
    assert changed_operations(deploy().stdout) == []


def test_failed_upgrade_leaves_current_alone(deployed, base_env, no_upgrade_env_yet):
    """A wheel that fails its locked hash (same name and size, other bytes) breaks the build."""
    _, pins = load_lock(UPGRADE_SET)
    kt = next(p for p in fetch(pins) if p.name.startswith(f"kt_kernel-{UPGRADE_SET}-"))
    before = sh(
        "systemctl show -p NRestarts -p ExecMainStartTimestamp -p ActiveState glm-flash.service", check=False
    ).stdout
    sh(f"mkdir -p {ENGINE}/wheelhouse && head -c {kt.stat().st_size} /dev/zero > {ENGINE}/wheelhouse/{kt.name}")
    try:
        run = deploy(f"engine_set={UPGRADE_SET}")
        assert run.returncode != 0
        # uv refuses the file, naming it: zeros are no zip ("Failed to download `kt-kernel==...`:
        # Failed to extract archive: kt_kernel-...whl: Invalid zip file structure"); other bytes in
        # a whole zip fail its hash ("Hash mismatch for `kt-kernel==...`")
        err = run.stderr
        assert f"Failed to download `kt-kernel=={kt.name.split('-')[1]}`" in err, err[-3000:]
        assert "Invalid zip file structure" in err or "Hash mismatch" in err, err[-3000:]
        s = state()
        assert s["current"] == base_env
        assert not any(v == "complete" for k, v in s["envs"].items() if k.startswith(UPGRADE_SET))
        assert (
            sh(
                "systemctl show -p NRestarts -p ExecMainStartTimestamp -p ActiveState glm-flash.service", check=False
            ).stdout
            == before
        )
    finally:
        sh(f"rm -f {ENGINE}/wheelhouse/{kt.name}")


BUILD_JOB = "glm-flash-job-engine-build.service"
SERVICE_START = "systemctl show -p NRestarts -p ExecMainStartTimestamp -p InvocationID -p ActiveState glm-flash.service"


def uv_installing() -> None:
    """Returns once uv installs into a new environment of the upgrade set on the host (polled)."""
    for _ in range(600):
        r = sh(f"ls -d {ENGINE}/envs/{UPGRADE_SET}-*/bin/python && pgrep -f -- '{UV} pip instal[l]'", check=False)
        if r.returncode == 0:
            return
        time.sleep(1)
    raise AssertionError("the upgrade's build never reached uv on the host")


def killed_while_the_environment_is_built(base_env: str) -> None:
    """#21 kill test, on the one post4 build a run makes: the upgrade's deploy SIGKILLed with its
    connection (a dropped connection, a closed laptop) while uv installs the new set on the host.
    The build runs as a transient unit (glm-flash-job-engine-build) that outlives the killed run:
    it goes on, unmarked, and `current` and the service's last start stay as they were. Not
    simulated: the build (uv installing the set's wheels offline) and the kill. The caller's next
    deploy must attach to the build (no second build beside it), finish it and switch, and the
    one after must change nothing."""
    before = sh(SERVICE_START).stdout
    started = deploy_killed_at(f"Engine environment {UPGRADE_SET}-", 3.0, f"engine_set={UPGRADE_SET}",
                               until=uv_installing)  # fmt: skip
    assert not any(op.startswith("Switch engine current") for op in started), started
    assert sh(f"systemctl is-active {BUILD_JOB}", check=False).stdout.strip() == "active", (
        "the kill did not land while the build ran (or the build died with the connection)"
    )
    s = state()
    new = [k for k in s["envs"] if k.startswith(UPGRADE_SET + "-")]
    assert len(new) == 1 and s["envs"][new[0]] != "complete" and s["current"] == base_env, s
    assert sh(f"test -e {ENGINE}/envs/{new[0]}/.glm-flash-complete", check=False).returncode != 0
    assert s["previous"] != new[0], s
    assert sh(SERVICE_START).stdout == before, "the service was touched"


def test_upgrade_builds_beside_switches_and_rollback_switches_back(deployed, base_env, no_upgrade_env_yet):
    """The upgrade's deploy is killed while it builds (above); the next one attaches to that build,
    finishes it and switches; then the upgrade is checked as built, and rolled back."""
    killed_while_the_environment_is_built(base_env)
    run = deploy(f"engine_set={UPGRADE_SET}")
    assert run.returncode == 0, run.stderr[-6000:]
    assert "is already running: attaching" in run.stdout + run.stderr, "the finishing run did not attach to the build"
    changed = changed_operations(run.stdout)
    assert any(op.startswith(f"Engine environment {UPGRADE_SET}-") for op in changed)
    s = state()
    new = s["current"]
    assert new.startswith(UPGRADE_SET + "-") and s["previous"] == base_env
    # the switch reached the service: it was (re)started after `current` moved
    assert service_last_start()[0] >= float(sh(f"stat -c %.Y {ENGINE}/current").stdout)
    assert s["envs"] == {base_env: "complete", new: "complete"}
    out = sh(f"cd /tmp && {PY} -W ignore -c 'import kt_kernel, sglang; print(kt_kernel.__version__)'").stdout.split()
    assert out == [UPGRADE_SET]
    report = json.loads(sh(f"{ROOT}/bin/glm-flash-engine verify --json").stdout)
    assert report["problems"] == [] and report["cudnn"] == "9.16.0.29"
    assert report["owners"]["transformers"]["also_installed"] is None  # post4 has no upstream transformers
    # same set again: nothing to do
    assert changed_operations(deploy(f"engine_set={UPGRADE_SET}").stdout) == []

    # One command back. It restarts the service, which cannot start without a GPU: the command
    # says so and exits 3 (switched, restart refused). A rollback that skipped the restart would
    # exit 0 and leave the service's last start as it was.
    _, invocation = service_last_start()
    cursor = journal_end()
    r = sh("glm-flash-rollback", check=False)
    s = state()
    assert s["current"] == base_env and s["previous"] == new
    assert r.returncode == 3, r.stdout + r.stderr
    assert "glm-flash-engine: switched, but `systemctl restart glm-flash.service` failed: " in r.stdout, r.stdout
    _, tried = service_last_start()
    assert tried and tried != invocation, "the rollback did not start the service again"
    log = run_log("glm-flash.service", tried, cursor)
    assert "no NVIDIA driver on this host" in log, log  # refused by its GPU preflight, nothing else
    assert sh(f"cd /tmp && {PY} -c 'import kt_kernel; print(kt_kernel.__version__)'").stdout.strip() == "0.7.0.post1"
    # the profile still says 0.7.0.post1: the deploy agrees with the rolled-back engine; it only
    # records the profile's engine_set again for glm-flash status (the last run had post4)
    assert changed_operations(deploy().stdout) == ["Profile values for glm-flash status (/etc/glm-flash/status.json)"]
    assert changed_operations(deploy().stdout) == []
