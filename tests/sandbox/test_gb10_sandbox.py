"""The GB10 deploy end to end: `pyinfra inventory/gb10_sandbox.py deploy.py` against a Debian 13
machine made to look like a GB10 box (sandbox/gb10.py), with real systemd.

Real: deploy.py and every role unchanged, systemd, apt (Debian's earlyoom), the hub client
against the stand-in hub, git fetching the fork and DeepGEMM by commit over HTTP, uv building
DeepGEMM's checkout into the environment (--no-deps --no-build-isolation), files/glm-flash-vllm-build
making a venv from a CPython 3.12 with uv, uv installing locks/vllm/0.24.0-aarch64.txt from PyPI
(the real aarch64 wheels, hash-checked, --no-deps, through the lock's cache), files/glm-flash-fork-patch checking and applying the fork's patch to those files and
finding the scheduler fix, the kernels copied, glm-flash-engine switching and rolling back,
glm-flash-check-flags looking up the fork's VLLM_* reads in the patched files, the units, earlyoom
with the deploy's drop-in, `glm-flash status`, tests/host/test_gb10.py.

Simulated (sandbox/gb10.py's docstring has the detail): the facts that say GB10 (`uname -m`
aarch64, nvidia-smi's query, DGX OS's release files, the GX10's /proc/meminfo, the CUDA 13.0
directory); no GPU device, so the driver check is skipped and the service's preflight refuses to
start. The fork is a stand-in of ours on loopback; so is DeepGEMM beside it, pure Python (the
real one compiles CUDA kernels with nvcc through its setup.py; this one's in-tree build backend
writes a wheel of one module, versioned +<short HEAD> as DeepGEMM's setup.py does); the hub serves a small checkpoint and a
stand-in drafter. python3.12 is a real CPython 3.12 whose sitecustomize answers uv's query as
aarch64 (so the lock's aarch64 files are installed, never executed), answers the build's CUDA
import from the installed files, and gives glm-flash-check-flags a replica
of vLLM 0.24.0's serve parser (sandbox/vllm-0.24.0-parser.json, kept equal to the real parser's by
tests/gb10/test_parser_dump.py), so `sandbox/gb10.py fresh` (destroy, then the documented `up`)
needs no flag.
Differs from DGX OS: Debian 13 underneath (Debian's packages and mirror, systemd 257 not 255,
Debian's earlyoom 1.8), x86_64, no build-essential/cmake (nothing compiles here).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, changed_operations, journal_end, run_log

sys.path.insert(0, str(REPO / "tests" / "gb10"))

STATE = REPO / ".sandbox" / "gb10"
INVENTORY = "inventory/gb10_sandbox.py"
ENGINE = "/opt/glm-flash/engine"
SITE = "lib/python3.12/site-packages"

pytestmark = pytest.mark.sandbox


def sh(command: str, check: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    r = subprocess.run(
        ["ssh", "-F", str(STATE / "ssh_config"), "gb10", command], capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert r.returncode == 0, f"{command}: {r.stdout}{r.stderr}"
    return r


def deploy(fork: str = "good", deepgemm: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "--json", INVENTORY, "deploy.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
        env=dict(os.environ, PYTHONUNBUFFERED="1", GLM_FLASH_GB10_FORK=fork, GLM_FLASH_GB10_DEEPGEMM=deepgemm),
    )


def outcomes(log: str) -> list[tuple[str, str]]:
    """(operation, Success | No changes | Error) in the order pyinfra's log shows them."""
    out: list[list[str]] = []
    for line in log.splitlines():
        if "--> Starting operation:" in line:
            out.append([line.split("Starting operation:", 1)[1].strip(), ""])
        elif out and not out[-1][1]:
            m = re.search(r"\[gb10-sandbox\] (Success|No changes|Error)", line)
            if m:
                out[-1][1] = m.group(1)
    return [(name, what) for name, what in out]


def commits() -> dict[str, str]:
    return json.loads((STATE / "info.json").read_text())["commits"]


def deepgemm_commit() -> str:
    return json.loads((STATE / "info.json").read_text())["deepgemm"]["good"]


def current() -> str:
    return sh(f"readlink -f {ENGINE}/current").stdout.strip()


class Run:
    times: dict[str, float] = {}


@pytest.fixture(scope="module")
def gb10(request, tmp_path_factory):
    """A fresh GB10 sandbox deployed twice at the fork's `good` commit; destroyed afterwards (disk)."""
    if request.config.getoption("--no-deploy") or request.config.getoption("--inventory") != "inventory/sandbox.py":
        pytest.skip("not applicable: the GB10 sandbox is built and deployed by this test itself")

    def destroy():  # also when the deploys fail: the machine holds ports and up to 3 GB
        print(f"GB10 sandbox timings (s): {json.dumps({k: round(v) for k, v in Run.times.items()})}")
        if not os.environ.get("GLM_FLASH_KEEP_GB10_SANDBOX"):
            subprocess.run([sys.executable, "sandbox/gb10.py", "destroy"], cwd=REPO, check=False)

    request.addfinalizer(destroy)
    t0 = time.time()
    subprocess.run([sys.executable, "sandbox/gb10.py", "fresh"], cwd=REPO, check=True)
    Run.times["up"] = time.time() - t0
    t0 = time.time()
    first = deploy()
    Run.times["first"] = time.time() - t0
    assert first.returncode == 0, f"first deploy failed:\n{first.stderr[-8000:]}"
    t0 = time.time()
    second = deploy()
    Run.times["second"] = time.time() - t0
    assert second.returncode == 0, f"second deploy failed:\n{second.stderr[-8000:]}"
    return first, second


def test_deploy_converges_and_a_second_run_changes_nothing(gb10):
    first, second = gb10
    assert changed_operations(first.stdout), "the first deploy changed nothing on a bare machine"
    assert changed_operations(second.stdout) == []
    env = current()
    assert env.startswith(f"{ENGINE}/envs/vllm-moet-{commits()['good'][:12]}-")


def test_the_downloader_has_the_wheels_its_python3_takes_whatever_uname_says(gb10):
    """`uname -m` answers aarch64 here (the stand-in); the machine's python3, Debian's x86_64 one, told
    the deploy what it is (the HostPython fact), so the downloader's environment holds the x86_64
    builds of hf-xet and PyYAML, which it loads. (aarch64 ones, chosen when `uname -m` was asked, are
    what this pip refused: tests/gb10/test_downloader_arm64.py installs those on an arm64 root.)"""
    assert sh("uname -m").stdout.strip() == "aarch64"
    python = "/opt/glm-flash/tools/hf-hub/bin/python"
    r = sh(f"{python} -c 'import hf_xet, platform, yaml; yaml.CSafeLoader; print(platform.machine())'")
    assert r.stdout.strip() == "x86_64"


def test_the_engine_is_the_real_release_with_the_forks_patch(gb10):
    """PyPI's vLLM 0.24.0 (its compiled parts too: the wheel as published), the stand-in fork's patch
    applied and recorded, the scheduler fix found, the cubins beside it."""
    env = current()
    r = sh(
        f"ls {env}/{SITE}/vllm/_C_stable_libtorch.abi3.so && cat {env}/.glm-flash-complete {env}/glm-flash-fork-patch.json"
    )
    assert "_C_stable_libtorch.abi3.so" in r.stdout
    marker = json.loads(r.stdout[r.stdout.index("{") : r.stdout.index("}") + 1])
    assert (marker["vllm"], marker["fork_commit"], marker["torch_cuda"]) == ("0.24.0", commits()["good"], "13.0")
    assert (
        "MambaSpec"
        in sh(
            f"grep -c MambaSpec {env}/{SITE}/vllm/v1/core/sched/scheduler.py; "
            f"grep -n 'MambaSpec' {env}/{SITE}/vllm/v1/core/sched/scheduler.py"
        ).stdout
    )
    assert sh(f"ls {env}/cubit-share").stdout.split() == ["exl3-wave-m8", "moe_w2_mm_k6144_a32.cubin"]


def test_the_lock_is_installed_by_uv_as_on_the_box(gb10):
    """uv installed locks/vllm/0.24.0-aarch64.txt as it does on the box: PyPI's aarch64 files (the
    stand-in python3.12 answered uv's query as aarch64; nothing here executes them), hash-checked,
    each a hard link into the lock's own cache (root's alone, named for the lock's sha256: the one
    set on disk), and no pip in the environment."""
    env = current()
    so = f"{env}/{SITE}/torch/lib/libtorch_cpu.so"
    assert sh(f"od -An -tu2 -j18 -N2 {so}").stdout.split() == ["183"]  # ELF e_machine: EM_AARCH64
    assert int(sh(f"stat -c %h {so}").stdout) >= 2  # the environment's name and the cache's
    assert sh(f"stat -c '%U %a' {ENGINE}/uv-cache").stdout.split() == ["root", "700"]
    lock = sh(f"sha256sum {ENGINE}/locks/{os.path.basename(env)}.vllm.txt").stdout.split()[0]
    assert sh(f"ls {ENGINE}/uv-cache").stdout.split() == [lock]
    assert not [f for f in sh(f"ls {env}/bin").stdout.split() if f.startswith("pip")]


def test_deepgemm_is_installed_in_the_serving_environment_at_the_pinned_commit(gb10):
    """The stand-in DeepGEMM (pure Python; the real one compiles CUDA with nvcc) fetched at the
    pinned commit, built into the environment the service runs, and recorded there."""
    env, commit = current(), deepgemm_commit()
    marker = json.loads(sh(f"cat {env}/.glm-flash-complete").stdout)
    assert (marker["deepgemm_commit"], marker["deep_gemm"]) == (commit, f"2.3.0+{commit[:7]}")
    assert sh(f"git -C {env}/deepgemm rev-parse HEAD").stdout.strip() == commit
    site = f"{env}/{SITE}"
    assert sh(f"cd {site} && ls -d deep_gemm*").stdout.split() == [
        "deep_gemm",
        f"deep_gemm-2.3.0+{commit[:7]}.dist-info",
    ]
    # installed by pip into this environment, importable by its interpreter
    assert sh(
        f"{env}/bin/python -c 'import deep_gemm; print(deep_gemm.__file__, deep_gemm.__version__)'"
    ).stdout.split() == [
        f"{site}/deep_gemm/__init__.py",
        "2.3.0",
    ]
    items = {i["item"]: i for i in json.loads(sh("glm-flash status --json", check=False).stdout)["items"]}
    assert items["deepgemm"]["state"] == "ok" and items["deepgemm"]["fields"]["commit"] == commit, items["deepgemm"]


def test_the_service_fails_to_start_only_for_the_missing_gpu(gb10):
    r = sh("systemctl start glm-flash.service", check=False)
    assert r.returncode != 0
    sh("systemctl stop glm-flash.service")  # no restarts left behind (Restart=on-failure)
    log = sh("journalctl --sync; journalctl -u glm-flash.service --no-pager -n 30 -o cat").stdout
    assert "0 NVIDIA GPU(s) visible, the profile needs 1; the engine cannot start." in log, log
    # refused in its preflight (ExecStartPre): the engine's own process never started
    assert sh("systemctl show -p ExecMainStartTimestampMonotonic --value glm-flash.service").stdout.strip() == "0"


def test_earlyoom_runs_with_the_deploys_drop_in_and_the_engine_is_its_first_choice(gb10):
    assert sh("systemctl is-active earlyoom.service").stdout.strip() == "active"
    cmd = sh("cat /proc/$(systemctl show -p MainPID --value earlyoom.service)/cmdline | tr '\\0' ' '").stdout
    # memory_guard_gib 4: SIGTERM below 4 GiB, SIGKILL below 2 GiB (KiB), swap ignored
    assert "-M 4194304,2097152 -s 100,100" in cmd, cmd
    assert sh("systemctl show -p OOMScoreAdjust --value glm-flash.service").stdout.strip() == "1000"
    drop = sh("systemctl show -p DropInPaths --value earlyoom.service").stdout
    assert "/etc/systemd/system/earlyoom.service.d/glm-flash.conf" in drop


def test_glm_flash_status_items(gb10):
    items = {i["item"]: i for i in json.loads(sh("glm-flash status --json", check=False).stdout)["items"]}
    assert items["memory guard"]["state"] == "ok", items["memory guard"]
    for name in ("fork patch", "scheduler fix", "fork kernels", "deepgemm"):
        assert items[name]["state"] == "ok", items[name]


def test_host_checks_of_the_gb10_box(gb10):
    """tests/host/test_gb10.py against this machine: what needs the GPU is not applicable."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/host/test_gb10.py",
            "--no-deploy",
            "--inventory",
            INVENTORY,
            "--hosts",
            "ssh://gb10",
            "--ssh-config",
            str(STATE / "ssh_config"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-6000:]
    assert " failed" not in r.stdout and " passed" in r.stdout, r.stdout[-3000:]
    for line in r.stdout.splitlines():
        if line.startswith("SKIPPED"):
            assert "not applicable: no NVIDIA device" in line, line


def test_with_nvidia_smi_answering_as_a_gb10_only_the_start_fails(gb10):
    """nvidia-smi's query answers GB10's line (sandbox/gb10.py `gpu gb10`): the deploy recognises one
    GPU of compute capability 12.1 with unified memory, finds everything else converged, and fails
    only where it starts the service: the preflight finds no GPU device."""
    subprocess.run([sys.executable, "sandbox/gb10.py", "gpu", "gb10"], cwd=REPO, check=True)
    try:
        r = deploy()
    finally:
        subprocess.run([sys.executable, "sandbox/gb10.py", "gpu", "none"], cwd=REPO, check=True)
    assert r.returncode != 0
    assert "1 GPU sm_121, 121.6 GiB unified memory" in r.stderr + r.stdout, r.stderr[-3000:]
    # a failed run prints no JSON: its log says what each operation did
    done = outcomes(r.stderr)
    assert [name for name, what in done if what != "No changes"] == [
        "glm-flash.service started from the files on disk"
    ], r.stderr[-4000:]
    assert done[-1][1] == "Error"
    log = sh("journalctl --sync; journalctl -u glm-flash.service --no-pager -n 30 -o cat").stdout
    assert "0 NVIDIA GPU(s) visible, the profile needs 1; the engine cannot start." in log, log


def test_a_fork_commit_whose_patch_does_not_apply_is_refused_with_nothing_changed(gb10):
    before_current, before_envs = current(), sh(f"ls {ENGINE}/envs").stdout.split()
    r = deploy("broken")
    assert r.returncode != 0
    assert "does not apply" in r.stderr + r.stdout, (r.stderr + r.stdout)[-6000:]
    assert current() == before_current
    broken = f"vllm-moet-{commits()['broken'][:12]}-"
    envs = sh(f"ls {ENGINE}/envs").stdout.split()
    assert [e for e in envs if not e.startswith(broken)] == before_envs
    left = [e for e in envs if e.startswith(broken)]
    assert all(sh(f"test ! -e {ENGINE}/envs/{e}/.glm-flash-complete", check=False).returncode == 0 for e in left)
    # refused on vLLM's wheel alone: the rest of the lock (torch among it) was never installed
    assert left, envs
    for e in left:
        site = f"{ENGINE}/envs/{e}/{SITE}"
        assert sh(f"test -d {site}/vllm && test ! -e {site}/torch", check=False).returncode == 0, e


def test_a_deepgemm_commit_not_in_its_repository_is_refused_with_nothing_changed(gb10):
    """A well-formed commit DeepGEMM's repository does not have: the build stops at the fetch,
    before anything is installed; the serving environment and `current` are untouched."""
    before_current, before_envs = current(), sh(f"ls {ENGINE}/envs").stdout.split()
    wrong = "d" * 40
    r = deploy(deepgemm=wrong)
    assert r.returncode != 0
    out = r.stderr + r.stdout
    assert f"has no commit {wrong}; deepgemm_ref must be a full commit of that repository" in out, out[-6000:]
    assert current() == before_current
    envs = sh(f"ls {ENGINE}/envs").stdout.split()
    new = [e for e in envs if e not in before_envs]
    assert len(new) <= 1 and [e for e in envs if e in before_envs] == before_envs
    for e in new:  # the fork fetched, nothing installed, never complete
        assert (
            sh(
                f"test ! -e {ENGINE}/envs/{e}/.glm-flash-complete && test ! -e {ENGINE}/envs/{e}/bin", check=False
            ).returncode
            == 0
        )
    assert json.loads(sh(f"cat {before_current}/.glm-flash-complete").stdout)["deepgemm_commit"] == deepgemm_commit()


def test_upgrade_to_another_fork_commit_and_roll_back(gb10):
    good = current()
    r = deploy("next")
    assert r.returncode == 0, r.stderr[-6000:]
    upgraded = current()
    assert f"vllm-moet-{commits()['next'][:12]}-" in upgraded
    assert sh(f"readlink -f {ENGINE}/previous").stdout.strip() == good
    assert "fork edit, v2" in sh(f"tail -2 {upgraded}/{SITE}/vllm/envs.py").stdout
    # The upgraded engine failed its starts until systemd refused more ("Start request repeated too
    # quickly": no GPU here, a broken engine on the box), the state a rollback is for. A cold CI run
    # reached it by chance; here the starts are made until one is refused (no new invocation).
    sh(
        "for i in $(seq 10); do a=$(systemctl show -p InvocationID --value glm-flash.service); "
        "systemctl start glm-flash.service 2>/dev/null; "
        '[ "$(systemctl show -p InvocationID --value glm-flash.service)" = "$a" ] && exit 0; done; exit 1'
    )
    # One command back. It restarts the service, which cannot start without a GPU: the command says so
    # and exits 3 (switched, restart refused). A rollback that skipped the restart would exit 0 and
    # leave the service's last start as it was.
    before = sh("systemctl show -p InvocationID --value glm-flash.service").stdout.strip()
    cursor = journal_end(sh)
    r = sh("glm-flash-rollback", check=False)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "glm-flash-engine: switched, but `systemctl restart glm-flash.service` failed: " in r.stdout, r.stdout
    tried = sh("systemctl show -p InvocationID --value glm-flash.service").stdout.strip()
    assert tried and tried != before, (
        "the rollback did not start the service again: "
        + r.stdout
        + sh("systemctl status --no-pager -n 20 glm-flash.service", check=False).stdout
    )
    sh("systemctl stop glm-flash.service")  # no restarts left behind (Restart=on-failure)
    log = run_log("glm-flash.service", tried, cursor, sh)
    assert "0 NVIDIA GPU(s) visible, the profile needs 1; the engine cannot start." in log, log
    assert current() == good
    assert sh(f"readlink -f {ENGINE}/previous").stdout.strip() == upgraded
    assert "fork edit, v2" not in sh(f"tail -2 {good}/{SITE}/vllm/envs.py").stdout


def test_a_fork_that_does_not_register_the_checkpoints_architecture_stops_before_the_switch(gb10):
    """The `no-model` commit's patch series applies and carries the scheduler fix, but registers no
    architecture (as vLLM 0.24.0 and upstream's patch): the flag check stops the host before the
    switch, naming the checkpoint's architecture; `current` is untouched."""
    before_current = current()
    r = deploy("no-model")
    assert r.returncode != 0
    out = r.stderr + r.stdout
    assert "architecture Glm5NextForConditionalGeneration (the checkpoint's config.json) is not in" in out, out[-6000:]
    assert current() == before_current
