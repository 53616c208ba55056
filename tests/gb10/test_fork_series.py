"""The fork's patches as a series, and the checkpoint's architecture through the patched registry,
on the real files of vLLM 0.24.0 (PyPI's wheel, cached and sha256-checked).

Simulated: the fork's patches. They are the GB10 sandbox's stand-in series (sandbox/gb10.py
`fork_patches`): the first edits envs.py, adds the fork's module and registers the checkpoint's
architecture (Glm5NextForConditionalGeneration, a module of ours and its line in vLLM's registry
table); the second ("patch 12") is the scheduler fix and edits envs.py after the first. A `model`
False series registers nothing, as vLLM 0.24.0 and the upstream fork's patch at d358bad do
(docs/sources.md §20). files/glm-flash-fork-patch and files/glm-flash-check-flags run as
subprocesses with the machine's git and python, as on a host.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# sandbox/gb10.py imports sandbox/sandbox.py as the module `sandbox`, while other tests import the
# repo's `sandbox` package (sandbox.fake_hub): which one sys.modules holds depends on what ran first.
# Import gb10 beside its own `sandbox`, then put back whatever was there.
_package = sys.modules.pop("sandbox", None)
sys.path.insert(0, str(REPO / "sandbox"))
try:
    import gb10  # noqa: E402  (the GB10 sandbox's stand-in fork)
finally:
    sys.path.remove(str(REPO / "sandbox"))
    sys.modules.pop("sandbox", None)
    if _package is not None:
        sys.modules["sandbox"] = _package

FORK_PATCH = REPO / "files" / "glm-flash-fork-patch"
CHECK_FLAGS = REPO / "files" / "glm-flash-check-flags"
COMMIT = "3f9a1c0d2b7e4a6f8c1d0e9b7a5c3e1f2d4b6a8c"


@pytest.fixture(scope="module")
def release() -> dict[str, str]:
    return gb10.release_files()


def site_of(tmp: Path, release: dict[str, str]) -> Path:
    """A site-packages holding the release's scheduler, envs and registry (and package markers)."""
    site = tmp / "lib" / "python3.12" / "site-packages"
    for rel, text in release.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (site / "vllm" / "__init__.py").write_text("")
    (site / gb10.MOE_MODULE).parent.mkdir(parents=True, exist_ok=True)
    return site


def fork_of(tmp: Path, release: dict[str, str], **kw) -> list[Path]:
    fork = tmp / "fork"
    (fork / "patch").mkdir(parents=True)
    for rel, text in gb10.fork_patches(release, "edit", **kw).items():
        (fork / rel).write_text(text)
    return [fork / rel for rel in gb10.SERIES]


def tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FORK_PATCH), *map(str, args)], capture_output=True, text=True)


def series(patches: list[Path]) -> list[str]:
    return [a for p in patches for a in ("--patch", str(p))]


def test_the_series_applies_in_order_and_is_recorded(tmp_path, release):
    site = site_of(tmp_path, release)
    patches = fork_of(tmp_path, release)
    before = {rel: (site / rel).read_text() for rel in release}
    # the wrong order: patch 12 edits what the first leaves, so it is refused, named, nothing written
    r = tool("check", "--site", site, *series(patches[::-1]))
    assert r.returncode == 2 and "0012-mamba-block-aligned-split.patch (patch 1 of 2) does not apply" in r.stderr
    assert {rel: (site / rel).read_text() for rel in release} == before
    # each alone is not the series: the second alone does not apply either
    assert tool("check", "--site", site, "--patch", patches[1]).returncode == 2
    r = tool("check", "--site", site, *series(patches))
    assert (r.returncode, r.stdout.strip()) == (
        1,
        "vllm-moet-v0.24.0.patch, 0012-mamba-block-aligned-split.patch: pending",
    )
    record = tmp_path / "record.json"
    r = tool(
        "apply", "--site", site, *series(patches), "--fork", tmp_path / "fork", "--record", record, "--commit", COMMIT
    )
    assert r.returncode == 0, r.stderr
    assert tool("check", "--site", site, *series(patches)).returncode == 0  # applied: the series reverses
    rec = json.loads(record.read_text())
    assert [p["path"] for p in rec["patches"]] == gb10.SERIES
    assert set(rec["files"]) == {gb10.ENVS, gb10.SCHEDULER, gb10.REGISTRY, gb10.MOE_MODULE, gb10.MODEL_MODULE}
    assert (site / gb10.ENVS).read_text().endswith("# edit\n# the fork's patch 12 (stand-in)\n")
    assert tool("scheduler-fix", "--site", site).returncode == 0
    # a second apply changes nothing
    mtimes = {rel: (site / rel).stat().st_mtime_ns for rel in rec["files"]}
    assert tool("apply", "--site", site, *series(patches), "--record", record, "--commit", COMMIT).returncode == 0
    assert {rel: (site / rel).stat().st_mtime_ns for rel in rec["files"]} == mtimes


def test_a_patch_made_against_another_release_is_refused_by_name(tmp_path, release):
    site = site_of(tmp_path, release)
    patches = fork_of(tmp_path, release, broken=True)
    r = tool("apply", "--site", site, *series(patches), "--record", tmp_path / "r.json")
    assert r.returncode == 2 and "vllm-moet-v0.24.0.patch (patch 1 of 2) does not apply" in r.stderr
    assert not (tmp_path / "r.json").exists() and not (site / gb10.MOE_MODULE).exists()


def check_flags(site: Path, config: Path) -> subprocess.CompletedProcess:
    """glm-flash-check-flags' architecture check alone (no parser: its module is unknown to it, so
    the check runs through the function the tool calls, on `site` as the engine's site-packages)."""
    code = (
        "import importlib.machinery, importlib.util, sys\n"
        f"loader = importlib.machinery.SourceFileLoader('cf', {str(CHECK_FLAGS)!r})\n"
        "spec = importlib.util.spec_from_loader('cf', loader); cf = importlib.util.module_from_spec(spec)\n"
        "loader.exec_module(cf)\n"
        f"cf.package_dir = lambda module: {str(site / 'vllm')!r}\n"
        f"problems = cf.unresolved_architectures('vllm.entrypoints.openai.api_server', {str(config)!r})\n"
        "print('\\n'.join(problems)); sys.exit(1 if problems else 0)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


@pytest.mark.parametrize("model", [True, False])
def test_the_checkpoints_architecture_must_resolve_through_the_patched_registry(tmp_path, release, model):
    site = site_of(tmp_path, release)
    patches = fork_of(tmp_path, release, model=model)
    r = tool("apply", "--site", site, *series(patches), "--record", tmp_path / "r.json", "--commit", COMMIT)
    assert r.returncode == 0, r.stderr
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": [gb10.ARCH], "model_type": "glm5_next"}))
    r = check_flags(site, config)
    if model:
        assert r.returncode == 0, r.stdout
    else:  # vLLM 0.24.0's own registry: no GLM-5.3-Flash
        assert r.returncode == 1
        assert f"architecture {gb10.ARCH} (the checkpoint's config.json) is not in the installed vLLM's" in r.stdout
        assert "this fork commit cannot serve the model" in r.stdout


def test_a_registered_module_that_is_missing_or_lacks_the_class_is_refused(tmp_path, release):
    site = site_of(tmp_path, release)
    patches = fork_of(tmp_path, release)
    assert tool("apply", "--site", site, *series(patches), "--record", tmp_path / "r.json").returncode == 0
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"architectures": [gb10.ARCH]}))
    (site / gb10.MODEL_MODULE).write_text("class SomethingElse:\n    pass\n")
    r = check_flags(site, config)
    assert r.returncode == 1 and "which" in r.stdout and "does not define" in r.stdout
    (site / gb10.MODEL_MODULE).unlink()
    r = check_flags(site, config)
    assert r.returncode == 1 and "which is not installed" in r.stdout
    config.write_text(json.dumps({"model_type": "x"}))
    assert "names no architectures" in check_flags(site, config).stdout


def test_the_scheduler_override_accepts_only_the_commit_it_names(tmp_path, release):
    """A fix written through a helper (no `mamba` in the assignment) fails the name check; the
    override accepts it for the one fork commit it names, and says so."""
    site = site_of(tmp_path, release)
    sched = site / gb10.SCHEDULER
    sched.write_text(sched.read_text().replace(gb10.BUG, "            block_size = self._aligned_block_size()\n"))
    assert tool("scheduler-fix", "--site", site).returncode == 1
    r = tool("scheduler-fix", "--site", site, "--verified-ref", "0" * 40, "--commit", COMMIT)
    assert r.returncode == 1 and "names another fork commit" in r.stderr
    r = tool("scheduler-fix", "--site", site, "--verified-ref", COMMIT, "--commit", COMMIT)
    assert r.returncode == 0 and "accepted because scheduler_fix_verified_ref names this fork commit" in r.stdout
    # the override never hides a scheduler that is not this vLLM's (exit 2 stays 2)
    sched.write_text("class Scheduler:\n    pass\n")
    assert tool("scheduler-fix", "--site", site, "--verified-ref", COMMIT, "--commit", COMMIT).returncode == 2
