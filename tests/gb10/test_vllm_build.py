"""files/glm-flash-vllm-build: the GB10 engine from wheels plus the fork's patch and kernels.

Real: git (the fork is a local repository of ours fetched by commit, as the tool fetches the
real one), files/glm-flash-fork-patch on the real Python files of PyPI's vLLM 0.24.0 wheel,
the kernel check, the record, the marker. Simulated (this machine has no aarch64, no GPU and
no CUDA torch): uv's venv, uv installing the lock (the release's Python files are copied into
the environment's site-packages instead) and the last import, which answers torch's CUDA.
The fork is a stand-in of ours shaped like its upstream (docs/sources.md §20): its patch at
patch/vllm-moet-v0.24.0.patch, cubins under kernels/cubins-sm120/. DeepGEMM is a local git
repository of ours fetched by commit (real git); its build and install by uv are simulated
(the real one compiles CUDA with nvcc): a deep_gemm package and its dist-info are written.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_fork_patch import ENVS, NEW_MODULE, SCHEDULER, standin_patch
from vllm_wheel import release_python

from tests.conftest import host_tool

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "locks" / "vllm" / "0.24.0-aarch64.txt"
PATCH = "patch/vllm-moet-v0.24.0.patch"
UV = "/opt/glm-flash/tools/uv"
KERNELS = "kernels/cubins-sm120"


def tool():
    return host_tool("glm-flash-vllm-build", "glm_flash_vllm_build")


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return release_python(tmp_path_factory.mktemp("vllm-0.24.0") / "site-packages")


def git(*args, cwd):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_fork(tmp_path: Path, release: Path, name="fork-src", **standin) -> tuple[Path, str]:
    """A git repository shaped like the fork's upstream; returns (path, commit)."""
    site = tmp_path / f"{name}-site"
    for rel in (SCHEDULER, ENVS):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(release / rel, site / rel)
    patch = standin_patch(site, tmp_path / name, **standin)
    repo = tmp_path / name / "fork"
    (repo / KERNELS / "exl3-wave-m8").mkdir(parents=True)
    (repo / KERNELS / "moe_w2_mm_k6144_a32.cubin").write_bytes(b"\x7fELF stand-in")
    (repo / KERNELS / "exl3-wave-m8" / "k1_m8.cubin").write_bytes(b"\x7fELF stand-in")
    assert patch == repo / PATCH
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "stand-in fork", cwd=repo)
    return repo, git("rev-parse", "HEAD", cwd=repo)


def make_deepgemm(tmp_path: Path) -> tuple[Path, str]:
    """A git repository standing in for DeepGEMM (pure Python); returns (path, commit)."""
    repo = tmp_path / "DeepGEMM"
    (repo / "deep_gemm").mkdir(parents=True, exist_ok=True)
    (repo / "deep_gemm" / "__init__.py").write_text('__version__ = "2.3.0"\n')
    git("init", "-q", cwd=repo)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "stand-in DeepGEMM", cwd=repo)
    return repo, git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def build(tmp_path, release, monkeypatch):
    """Run the tool's build() with the simulated uv; return (result or exception, calls, env_dir)."""
    t = tool()
    root = tmp_path / "opt"
    monkeypatch.setenv("GLM_FLASH_ROOT", str(root))
    real_run = t.run
    calls: list[list[str]] = []
    building = {"env": "ENV"}

    def run(cmd, cwd=None, env=None, capture=False):
        calls.append([str(c) for c in cmd])
        env_dir = root / "engine" / "envs" / building["env"]
        site = env_dir / "lib" / "python3.12" / "site-packages"
        if cmd[0] == "git" or (len(cmd) > 1 and str(cmd[1]).endswith("glm-flash-fork-patch")):
            return real_run(cmd, cwd=cwd, env=env, capture=capture)
        if cmd[:2] == [UV, "venv"]:
            (env_dir / "bin").mkdir(parents=True)
            return ""
        if cmd[:3] == [UV, "pip", "install"] and "--no-build-isolation" in cmd:
            src = Path(cmd[-1])  # simulated: DeepGEMM's setup.py build (nvcc) and uv's install
            version = f"2.3.0+{git('rev-parse', '--short', 'HEAD', cwd=src)}"
            shutil.copytree(src / "deep_gemm", site / "deep_gemm")
            (site / f"deep_gemm-{version}.dist-info").mkdir()
            return ""
        if cmd[:3] == [UV, "pip", "install"] and cmd[-1].endswith(".glm-flash-vllm-wheel.txt"):
            wanted = Path(cmd[-1]).read_text()  # vLLM's entry of the lock alone: its pin and hashes
            assert wanted.startswith("vllm==0.24.0 \\\n") and wanted in LOCK.read_text(), wanted
            shutil.copytree(release, site)  # simulated: the vllm wheel
            return ""
        if cmd[:3] == [UV, "pip", "install"]:
            assert cmd[-1] == str(LOCK) and (site / SCHEDULER).is_file()  # the rest; uv keeps the patched vllm
            return ""
        if "sysconfig" in cmd[-1]:
            return f"{site}\n"
        if "importlib.metadata" in cmd[-1]:
            return "0.24.0\n"
        if "moe_w2_cubit" in cmd[-1]:  # simulated: the import needs the fork's real patch and CUDA torch
            return json.dumps({"vllm": "0.24.0", "torch": "2.11.0", "torch_cuda": "13.0"}) + "\n"
        raise AssertionError(f"unexpected command {cmd}")

    monkeypatch.setattr(t, "run", run)

    deepgemm = {}

    def go(fork: Path, commit: str, patch=PATCH, kernels=KERNELS, env="ENV", deepgemm_commit=None):
        building["env"] = env
        if not deepgemm:
            deepgemm["repo"], deepgemm["commit"] = make_deepgemm(tmp_path)
        args = type(
            "Args",
            (),
            dict(
                env=env,
                python="/usr/bin/python3.12",
                uv=UV,
                lock=str(LOCK),
                vllm_version="0.24.0",
                fork_repo=str(fork),
                fork_commit=commit,
                fork_patch=[patch],
                fork_kernels=kernels,
                scheduler_fix_verified_ref="",
                deepgemm_repo=str(deepgemm["repo"]),
                deepgemm_commit=deepgemm_commit or deepgemm["commit"],
            ),
        )
        try:
            return t.build(args), calls, root / "engine" / "envs" / env
        except t.Fail as e:
            return e, calls, root / "engine" / "envs" / env

    return go


def test_builds_from_the_lock_applies_the_fork_and_records_it(build, tmp_path, release):
    fork, commit = make_fork(tmp_path, release)
    result, calls, env_dir = build(fork, commit)
    assert result == 0, result
    # the lock by the deploy's uv, from PyPI, hash-checked, nothing beyond its pins, through the
    # lock's own cache (root's alone: the environments' files are hard links into it)
    uv = [c for c in calls if c[:3] == [UV, "pip", "install"]]
    cache = env_dir.parents[1] / "uv-cache" / hashlib.sha256(LOCK.read_bytes()).hexdigest()
    common = ["--quiet", "--no-config", "--link-mode", "hardlink", "--compile-bytecode", "--no-deps"]
    pypi = [*common, "--cache-dir", str(cache), "--python", f"{env_dir}/bin/python", "--system-certs",
            "--index-url", "https://pypi.org/simple", "--require-hashes", "--only-binary", ":all:", "-r"]  # fmt: skip
    # vLLM's wheel alone, patched and its scheduler fix found, before the lock's other wheels
    assert uv[0][3:] == [*pypi, str(env_dir / ".glm-flash-vllm-wheel.txt")] and uv[1][3:] == [*pypi, str(LOCK)]
    patched = next(i for i, c in enumerate(calls) if len(c) > 2 and c[1].endswith("glm-flash-fork-patch"))
    assert calls.index(uv[0]) < patched < calls.index(uv[1])
    assert not (env_dir / ".glm-flash-vllm-wheel.txt").exists()
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    # the fork is fetched and its parts checked before anything is installed
    order = [i for i, c in enumerate(calls) if c[0] == "git"]
    assert max(order) < calls.index(next(c for c in calls if c[:2] == [UV, "venv"]))
    site = env_dir / "lib" / "python3.12" / "site-packages"
    assert (site / NEW_MODULE).is_file()
    record = json.loads((env_dir / "glm-flash-fork-patch.json").read_text())
    assert record["fork_commit"] == commit and SCHEDULER in record["files"]
    assert sorted(p.name for p in (env_dir / "cubit-share").rglob("*.cubin")) == [
        "k1_m8.cubin",
        "moe_w2_mm_k6144_a32.cubin",
    ]
    marker = json.loads((env_dir / ".glm-flash-complete").read_text())
    assert (marker["fork_commit"], marker["vllm"], marker["fork_patches"]) == (commit, "0.24.0", [PATCH])
    assert git("rev-parse", "HEAD", cwd=env_dir / "fork") == commit
    # DeepGEMM: fetched at its commit before anything is installed, built into the environment after
    # the lock without isolation, recorded
    dg = git("rev-parse", "HEAD", cwd=env_dir / "deepgemm")
    assert (marker["deepgemm_commit"], marker["deep_gemm"]) == (dg, f"2.3.0+{dg[:7]}")
    build_cache = env_dir / ".glm-flash-uv-cache"  # DeepGEMM's build meets no other checkout's: deleted after
    assert uv[2][3:] == [*common, "--cache-dir", str(build_cache), "--python", f"{env_dir}/bin/python",
                         "--no-build-isolation", "--no-index", str(env_dir / "deepgemm")]  # fmt: skip
    assert len(uv) == 3 and not build_cache.exists()
    assert (site / "deep_gemm" / "__init__.py").is_file()


def test_a_deepgemm_commit_not_in_its_repository_stops_before_installing(build, tmp_path, release):
    fork, commit = make_fork(tmp_path, release)
    result, calls, env_dir = build(fork, commit, deepgemm_commit="d" * 40)
    assert f"has no commit {'d' * 40}; deepgemm_ref must be a full commit" in str(result), result
    assert not [c for c in calls if c[:2] == [UV, "venv"]] and not (env_dir / ".glm-flash-complete").exists()


def test_a_deepgemm_tag_is_refused_before_anything(build, tmp_path, release):
    fork, commit = make_fork(tmp_path, release)
    result, calls, _ = build(fork, commit, deepgemm_commit="nv-dev")
    assert "--deepgemm-commit 'nv-dev' is not a full 40-character commit hash" in str(result)
    assert calls == []


def engine_tool(root: Path, *args: str) -> str:
    """The real files/glm-flash-engine on the install root the builds wrote."""
    r = subprocess.run(
        [sys.executable, str(REPO / "files" / "glm-flash-engine"), *args],
        capture_output=True,
        text=True,
        env=dict(os.environ, GLM_FLASH_ROOT=str(root), GLM_FLASH_CONF_DIR=str(root / "conf")),
    )
    assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r.stdout


def test_upgrade_between_fork_commits_builds_beside_and_rollback_restores(build, tmp_path, release):
    """Two commits of the stand-in fork, each built into its own environment (its own patch applied
    and recorded), switched to in turn, then rolled back with the real glm-flash-engine. Simulated as
    in the other builds: the venv and pip (the release's files copied), no service restart."""
    fork, first = make_fork(tmp_path, release)
    text = (fork / PATCH).read_text()
    assert text.count("+# glm-flash stand-in fork edit\n") == 1
    (fork / PATCH).write_text(
        text.replace("+# glm-flash stand-in fork edit\n", "+# glm-flash stand-in fork edit, v2\n")
    )
    git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qam", "second commit", cwd=fork)
    second = git("rev-parse", "HEAD", cwd=fork)
    a, b = f"vllm-moet-{first[:12]}-aaaaaaaa", f"vllm-moet-{second[:12]}-bbbbbbbb"
    root = tmp_path / "opt"
    (root / "conf").mkdir(parents=True)  # /etc/glm-flash on a host (the service role makes it)

    def deployed(env: str) -> None:
        """What roles/service.py keeps per environment: the spec its parser accepted, the unit's env."""
        kept = root / "engine" / "envs" / env / ".glm-flash-service"
        kept.mkdir()
        spec = {"python": f"{root}/engine/envs/{env}/bin/python", "module": "vllm.entrypoints.openai.api_server"}
        (kept / "launch.json").write_text(json.dumps(spec))
        (kept / "glm-flash.env").write_text(f"VLLM_MOE_W2=1\nVLLM_MOE_W2_CUBIT_DIR={root}/engine/current/cubit-share\n")

    assert build(fork, first, env=a)[0] == 0
    deployed(a)
    engine_tool(root, "switch", a)
    assert build(fork, second, env=b)[0] == 0  # beside: `current` still points at the first
    deployed(b)
    assert (root / "engine" / "current").resolve().name == a

    def serving() -> tuple[str, str]:
        env_dir = (root / "engine" / "current").resolve()
        envs = (env_dir / "lib" / "python3.12" / "site-packages" / ENVS).read_text()
        return json.loads((env_dir / "glm-flash-fork-patch.json").read_text())["fork_commit"], envs.splitlines()[-1]

    engine_tool(root, "switch", b)
    assert serving() == (second, "# glm-flash stand-in fork edit, v2")
    assert (root / "engine" / "previous").resolve().name == a
    engine_tool(root, "rollback", "--no-restart")
    assert serving() == (first, "# glm-flash stand-in fork edit")
    assert (root / "engine" / "previous").resolve().name == b
    # the launch spec checked with the first environment is put back for the service
    assert json.loads((root / "conf" / "launch.json").read_text())["python"].endswith(f"/envs/{a}/bin/python")


def test_fork_commit_without_the_patch_stops_before_installing(build, tmp_path, release):
    fork, commit = make_fork(tmp_path, release)
    result, calls, env_dir = build(fork, commit, patch="patch/vllm-moet-v0.25.0.patch")
    assert "has no patch/vllm-moet-v0.25.0.patch (fork_patches)" in str(result)
    assert not [c for c in calls if c[:2] == [UV, "venv"]] and not (env_dir / ".glm-flash-complete").exists()


def test_fork_commit_without_kernels_stops_before_installing(build, tmp_path, release):
    fork, commit = make_fork(tmp_path, release)
    result, calls, _ = build(fork, commit, kernels="kernels/cubins-sm121")
    assert "no kernel directory" in str(result) and "fork_kernels" in str(result)
    assert not [c for c in calls if c[:2] == [UV, "venv"]]


def test_patch_that_does_not_apply_is_refused_and_the_environment_stays_incomplete(build, tmp_path, release):
    fork, commit = make_fork(tmp_path, release, break_envs=True)
    result, calls, env_dir = build(fork, commit)
    assert "does not apply" in str(result) and ENVS in str(result)
    # refused on vLLM's wheel alone: the lock's other wheels never fetched
    assert [c[-1] for c in calls if c[:3] == [UV, "pip", "install"]] == [str(env_dir / ".glm-flash-vllm-wheel.txt")]
    site = env_dir / "lib" / "python3.12" / "site-packages"
    assert (site / SCHEDULER).read_bytes() == (release / SCHEDULER).read_bytes()  # nothing written
    assert not (site / NEW_MODULE).exists() and not (env_dir / ".glm-flash-complete").exists()


def test_fork_without_the_scheduler_fix_is_refused(build, tmp_path, release):
    fork, commit = make_fork(tmp_path, release, scheduler_fix=False)
    result, calls, env_dir = build(fork, commit)
    assert "patch 12" in str(result) and not (env_dir / ".glm-flash-complete").exists()
    assert [c[-1] for c in calls if c[:3] == [UV, "pip", "install"]] == [str(env_dir / ".glm-flash-vllm-wheel.txt")]


def test_a_lock_of_another_release_is_refused(tmp_path):
    t = tool()
    other = tmp_path / "lock.txt"
    other.write_text(LOCK.read_text().replace("vllm==0.24.0", "vllm==0.25.0"))
    with pytest.raises(t.Fail, match="locks vllm 0.25.0, not 0.24.0"):
        t.read_lock(str(other), "0.24.0")
    t.read_lock(str(LOCK), "0.24.0")


def status_module():
    loader = importlib.machinery.SourceFileLoader("glm_flash_status", str(REPO / "files" / "glm-flash"))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


def test_glm_flash_status_items_for_the_fork(build, tmp_path, release, monkeypatch):
    """`glm-flash status` on GB10: the fork's patch, the scheduler fix and the kernels of `current`,
    by the real tool on the built environment; each turns into a problem when its part breaks."""
    fork, commit = make_fork(tmp_path, release)
    assert build(fork, commit)[0] == 0
    root = tmp_path / "opt"
    (root / "engine" / "current").symlink_to(root / "engine" / "envs" / "ENV")
    bins = root / "bin"
    bins.mkdir()
    (bins / "glm-flash-fork-patch").symlink_to(REPO / "files" / "glm-flash-fork-patch")
    st = status_module()
    cfg = {
        "install_root": str(root),
        "python_version": "3.12",
        "fork_patches": [PATCH],
        "vllm_ref": commit,
        "platform": "gb10",
    }

    def items():
        cmds = st.fork_commands(cfg, str(bins))
        assert all(c[0] == "/usr/bin/python3" for c in cmds)
        return {n: st.decide_fork(n, *st.run([sys.executable, *c[1:]])) for n, c in zip(st.FORK_ITEMS, cmds)}

    got = items()
    assert {n: i["state"] for n, i in got.items()} == {"fork patch": "ok", "scheduler fix": "ok", "fork kernels": "ok"}
    site = root / "engine" / "current" / "lib" / "python3.12" / "site-packages"
    sched = site / SCHEDULER
    sched.write_text(sched.read_text().replace("MambaSpec", "AttentionSpec"))  # someone edited the patched file
    shutil.rmtree(root / "engine" / "current" / "cubit-share")
    got = items()
    assert {n: i["state"] for n, i in got.items()} == {
        "fork patch": "problem",
        "scheduler fix": "problem",
        "fork kernels": "problem",
    }
    assert "does not apply" in got["fork patch"]["detail"] and got["fork patch"]["fix"].startswith("run the deploy")


def test_the_lock_cache_outlives_a_build_and_holds_one_lock_at_most(tmp_path, monkeypatch):
    """The lock's unpacked wheels are kept for the next build of the same lock (a new fork commit
    downloads nothing); another lock's are deleted first, so one set at most stays on disk."""
    t = tool()
    monkeypatch.setenv("GLM_FLASH_ROOT", str(tmp_path))
    top = tmp_path / "engine" / "uv-cache"
    mine = top / hashlib.sha256(LOCK.read_bytes()).hexdigest()
    (mine / "wheels-v5").mkdir(parents=True)  # what uv left from an earlier build of this lock
    (top / ("0" * 64) / "wheels-v5").mkdir(parents=True)  # another lock's
    top.chmod(0o755)  # made by hand, or by an older deploy
    assert t.lock_cache(str(LOCK)) == str(mine)
    assert sorted(p.name for p in top.iterdir()) == [mine.name] and (mine / "wheels-v5").is_dir()
    assert stat.S_IMODE(top.stat().st_mode) == 0o700
    other = tmp_path / "other.txt"
    other.write_text("vllm==0.24.0 --hash=sha256:" + "1" * 64 + "\n")
    assert t.lock_cache(str(other)) == str(top / hashlib.sha256(other.read_bytes()).hexdigest())
    assert list(top.iterdir()) == []
