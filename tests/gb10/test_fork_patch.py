"""files/glm-flash-fork-patch on the real Python files of vLLM 0.24.0 (PyPI's wheel, cached and
sha256-checked by tests/engine/pypi.py), the release the vLLM-Moet fork's patch is made for.

Simulated: the fork's patch. Its real one (1 MB, generated from the fork's vLLM branch) is not
ours to copy, so each test writes a stand-in patch of ours in the same shape (`git diff` headers,
edits to release files, new files) against the real files: the scheduler fix of the GB10 field
report and a new module. Hand-verified against the real thing (docs/sources.md §20): the fork's
patch at commit d358bad applies with `git apply --check` to these same files.

The tool runs as a subprocess with the machine's git, as on a host.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_wheel import SCHEDULER, release_python

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "files" / "glm-flash-fork-patch"
BUG = "            block_size = self.cache_config.block_size\n"
FIX = (
    "            # stand-in of the fork's patch 12: the Mamba group's block size\n"
    "            block_size = next(\n"
    "                (\n"
    "                    g.kv_cache_spec.block_size\n"
    "                    for g in self.kv_cache_config.kv_cache_groups\n"
    '                    if type(g.kv_cache_spec).__name__ == "MambaSpec"\n'
    "                ),\n"
    "                self.cache_config.block_size,\n"
    "            )\n"
)
NEW_MODULE = "vllm/model_executor/layers/quantization/utils/glm_flash_standin.py"
ENVS = "vllm/envs.py"


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> Path:
    return release_python(tmp_path_factory.mktemp("vllm-0.24.0") / "site-packages")


@pytest.fixture
def site(tmp_path, release) -> Path:
    """A fresh copy of the release's scheduler, envs and their package markers."""
    root = tmp_path / "site-packages"
    for rel in (SCHEDULER, ENVS, "vllm/__init__.py", "vllm/model_executor/layers/quantization/utils/__init__.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((release / rel).read_bytes())
    return root


def file_diff(rel: str, old: str | None, new: str) -> str:
    """One file's part of a git patch (`git diff` headers; a new file when old is None)."""
    head = f"diff --git a/{rel} b/{rel}\n"
    if old is None:
        head += "new file mode 100644\n"
    body = difflib.unified_diff(
        [] if old is None else old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        "/dev/null" if old is None else f"a/{rel}",
        f"b/{rel}",
        n=3,
    )
    return head + "".join(body)


def standin_patch(site: Path, tmp_path: Path, scheduler_fix=True, break_envs=False) -> Path:
    sched = (site / SCHEDULER).read_text()
    assert sched.count(BUG) == 1, "vLLM 0.24.0's scheduler no longer has the line this stand-in edits"
    envs = (site / ENVS).read_text()
    parts = []
    if scheduler_fix:
        parts.append(file_diff(SCHEDULER, sched, sched.replace(BUG, FIX)))
    else:
        parts.append(file_diff(SCHEDULER, sched, sched.replace(BUG, BUG + "            # stand-in: no fix\n")))
    first = envs.splitlines(keepends=True)
    if break_envs:  # a fork commit made against another release: its context is not in these files
        first[-1] = "# a last line vLLM 0.24.0 does not have\n"
    parts.append(file_diff(ENVS, "".join(first), "".join(first) + "# glm-flash stand-in fork edit\n"))
    parts.append(file_diff(NEW_MODULE, None, '"""Stand-in of a module the fork adds."""\nON = True\n'))
    out = tmp_path / "fork" / "patch" / "vllm-moet-v0.24.0.patch"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(parts))
    return out


def run(*args):
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True)


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_release_has_the_scheduler_bug(site):
    r = run("scheduler-fix", "--site", site)
    assert r.returncode == 1, r.stderr
    assert "self.cache_config.block_size" in r.stderr and "Mamba group" in r.stderr


def test_standin_patch_checks_applies_records_and_reapplies_as_a_no_op(site, tmp_path):
    patch = standin_patch(site, tmp_path)
    before = snapshot(site)
    r = run("check", "--site", site, "--patch", patch, "--commit", "a" * 40)
    assert (r.returncode, r.stdout.strip()) == (1, "vllm-moet-v0.24.0.patch (fork commit aaaaaaaaaaaa): pending")
    assert snapshot(site) == before, "check changed a file"

    record = tmp_path / "state" / "fork-patch.json"
    r = run("apply", "--site", site, "--patch", patch, "--record", record, "--commit", "a" * 40)
    assert r.returncode == 0, r.stderr
    assert (site / NEW_MODULE).read_text().endswith("ON = True\n")
    rec = json.loads(record.read_text())
    assert rec["fork_commit"] == "a" * 40
    assert set(rec["files"]) == {SCHEDULER, ENVS, NEW_MODULE}
    assert [p["sha256"] for p in rec["patches"]] == [__import__("hashlib").sha256(patch.read_bytes()).hexdigest()]
    compile((site / SCHEDULER).read_text(), SCHEDULER, "exec")

    fix = run("scheduler-fix", "--site", site)
    assert fix.returncode == 0, fix.stderr

    after, stamp = snapshot(site), record.stat().st_mtime_ns
    again = run("apply", "--site", site, "--patch", patch, "--record", record, "--commit", "a" * 40)
    assert again.returncode == 0, again.stderr
    assert snapshot(site) == after and record.stat().st_mtime_ns == stamp
    assert run("check", "--site", site, "--patch", patch).returncode == 0


def test_patch_that_does_not_apply_is_refused_with_nothing_changed(site, tmp_path):
    patch = standin_patch(site, tmp_path, break_envs=True)  # the scheduler part alone would apply
    before = snapshot(site)
    record = tmp_path / "state" / "fork-patch.json"
    r = run("apply", "--site", site, "--patch", patch, "--record", record, "--commit", "b" * 40)
    assert r.returncode == 2
    assert "does not apply" in r.stderr and ENVS in r.stderr and "fork commit bbbbbbbbbbbb" in r.stderr
    assert "expected the vLLM release" in r.stderr
    assert snapshot(site) == before and not record.exists()


def test_patch_naming_a_file_the_release_lacks_is_refused(site, tmp_path):
    patch = standin_patch(site, tmp_path)
    text = patch.read_text().replace(f"a/{ENVS} b/{ENVS}", "a/vllm/envs_v033.py b/vllm/envs_v033.py")
    patch.write_text(
        text.replace(f"--- a/{ENVS}", "--- a/vllm/envs_v033.py").replace(f"+++ b/{ENVS}", "+++ b/vllm/envs_v033.py")
    )
    r = run("check", "--site", site, "--patch", patch)
    assert r.returncode == 2 and "vllm/envs_v033.py" in r.stderr and "does not have" in r.stderr


def test_fork_commit_without_the_patch_is_refused(site, tmp_path):
    r = run("check", "--site", site, "--patch", tmp_path / "fork" / "patch" / "vllm-moet-v0.25.0.patch")
    assert r.returncode == 2 and "no patch at" in r.stderr and "vllm-moet-v0.25.0.patch" in r.stderr


def test_partly_applied_release_is_refused(site, tmp_path):
    """Someone ran half the patch by hand: neither forward nor reverse applies."""
    patch = standin_patch(site, tmp_path)
    sched = site / SCHEDULER
    sched.write_text(sched.read_text().replace(BUG, FIX))
    r = run("check", "--site", site, "--patch", patch)
    assert r.returncode == 2 and SCHEDULER in r.stderr


def test_patch_without_the_fix_is_seen_after_applying(site, tmp_path):
    patch = standin_patch(site, tmp_path, scheduler_fix=False)
    assert run("apply", "--site", site, "--patch", patch, "--record", tmp_path / "r.json").returncode == 0
    r = run("scheduler-fix", "--site", site)
    assert r.returncode == 1 and "patch 12" in r.stderr


def test_site_inside_a_git_checkout_still_takes_paths_from_site_packages(site, tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    patch = standin_patch(site, tmp_path)
    r = run("apply", "--site", site, "--patch", patch, "--record", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    assert (site / NEW_MODULE).is_file() and run("scheduler-fix", "--site", site).returncode == 0


def test_scheduler_of_another_vllm_is_named(tmp_path):
    root = tmp_path / "site-packages"
    (root / SCHEDULER).parent.mkdir(parents=True)
    (root / SCHEDULER).write_text("class Scheduler:\n    def schedule(self):\n        pass\n")
    r = run("scheduler-fix", "--site", root)
    assert r.returncode == 2 and "_mamba_block_aligned_split" in r.stderr


def test_kernels_dir_must_hold_cubins(tmp_path):
    d = tmp_path / "kernels" / "cubins-sm120"
    assert run("kernels", "--dir", d).returncode == 2
    d.mkdir(parents=True)
    r = run("kernels", "--dir", d)
    assert r.returncode == 2 and "no .cubin" in r.stderr
    (d / "exl3-wave-m8").mkdir()
    (d / "exl3-wave-m8" / "k1_m8.cubin").write_bytes(b"\x7fELF stand-in")
    (d / "moe_w2_mm_k512.cubin").write_bytes(b"\x7fELF stand-in")
    r = run("kernels", "--dir", d)
    assert r.returncode == 0 and "2 cubins" in r.stdout


def test_git_is_what_applies(monkeypatch):
    """The fork's Dockerfile uses `git apply`; this machine must have git for these tests to mean it."""
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0
    assert os.access(TOOL, os.X_OK)


def test_the_lock_carries_pypis_digest_of_the_release():
    """locks/vllm/0.24.0-aarch64.txt lists PyPI's own sha256 of the vLLM 0.24.0 files: the x86_64
    wheel fetched here (verified against PyPI's digest by tests/engine/pypi.py) is one of them."""
    import hashlib

    from vllm_wheel import pypi

    whl = pypi.wheel("vllm", "0.24.0")
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    lock = (REPO / "locks" / "vllm" / "0.24.0-aarch64.txt").read_text()
    block = lock[lock.index("\nvllm==0.24.0 \\") :].split("\n    #", 1)[0]
    assert f"--hash=sha256:{digest}" in block


def test_the_launch_module_is_the_servers_of_the_release(release):
    """roles/engines/vllm/launch.py runs `python -m VLLM_MODULE`: it must be a runnable module of vLLM 0.24.0."""
    from roles.engines.vllm.launch import VLLM_MODULE

    path = release / (VLLM_MODULE.replace(".", "/") + ".py")
    assert path.is_file(), f"vLLM 0.24.0 has no {VLLM_MODULE}"
    assert 'if __name__ == "__main__":' in path.read_text()
