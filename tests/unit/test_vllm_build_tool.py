"""files/glm-flash-vllm-build: the hash lock it installs the fork's requirements from.

The build itself needs a GB10 (aarch64, CUDA 13, the fork; simulated by nothing here): the lock
is read and refused as the tool reads it, and the pip commands it would run are recorded
instead of run (the real pip would need the network and the fork's wheels)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REPO_URL, REF = "https://github.com/lrozewicz/vLLM-Moet-GB10", "3f9a1c0d2b7e4a6f8c1d0e9b7a5c3e1f2d4b6a8c"
PYPI, TORCH = "https://pypi.org/simple", "https://download.pytorch.org/whl/cu130/"
H = "--hash=sha256:" + "a" * 64


def tool():
    loader = importlib.machinery.SourceFileLoader("glm_flash_vllm_build", str(REPO / "files" / "glm-flash-vllm-build"))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


def write(tmp_path, indexes, repo=REPO_URL, ref=REF) -> str:
    p = tmp_path / "lock.json"
    p.write_text(json.dumps({"repo": repo, "ref": ref, "python": "3.12", "indexes": indexes}))
    return str(p)


def test_lock_read_per_index(tmp_path):
    t = tool()
    lock = write(tmp_path, {PYPI: [f"ninja==1.13.0 {H}"], TORCH: [f"torch==2.14.0+cu130 {H} {H}"]})
    assert t.read_lock(lock, REPO_URL, REF) == {PYPI: [f"ninja==1.13.0 {H}"], TORCH: [f"torch==2.14.0+cu130 {H} {H}"]}


@pytest.mark.parametrize(
    "indexes, ref, problem",
    [
        ({PYPI: ["ninja==1.13.0"]}, REF, "is not pinned with == and a sha256"),
        ({PYPI: [f"ninja>=1.13 {H}"]}, REF, "is not pinned with == and a sha256"),
        ({PYPI: [f"torch==2.14.0 {H}"], TORCH: [f"torch==2.14.0+cu130 {H}"]}, REF, "torch is locked twice"),
        ({"http://pypi.org/simple": [f"ninja==1.13.0 {H}"]}, REF, "is not https://"),
        ({PYPI: [f"ninja==1.13.0 {H}"]}, "0" * 40, f"not {REPO_URL}@{REF}"),
        ({PYPI: []}, REF, "holds no pins"),
    ],
)
def test_lock_refused(tmp_path, indexes, ref, problem):
    t = tool()
    with pytest.raises(t.Fail, match=problem.replace("+", r"\+")):
        t.read_lock(write(tmp_path, indexes, ref=ref), REPO_URL, REF)


def test_each_index_installs_only_its_own_pins_with_hashes(tmp_path, monkeypatch):
    t = tool()
    calls = []

    def run(cmd, cwd=None, env=None, capture=False):
        req = cmd[cmd.index("-r") + 1]
        calls.append((cmd, Path(req).read_text(), env))
        return ""

    monkeypatch.setattr(t, "run", run)
    t.install_locked(
        ["py", "-m", "pip", "install"], {PYPI: [f"ninja==1.13.0 {H}"], TORCH: [f"torch==2.14.0 {H}"]}, "/src"
    )
    assert [(c[0][4:8], c[1]) for c in calls] == [
        (["--index-url", PYPI, "--require-hashes", "--no-deps"], f"ninja==1.13.0 {H}\n"),
        (["--index-url", TORCH, "--require-hashes", "--no-deps"], f"torch==2.14.0 {H}\n"),
    ]
    # no configuration, find-links or extra index of the host can add a source
    assert all(c[2]["PIP_CONFIG_FILE"] and c[2]["PIP_EXTRA_INDEX_URL"] == "" == c[2]["PIP_FIND_LINKS"] for c in calls)
    assert not any("--extra-index-url" in c[0] or "--upgrade" in c[0] for c in calls)
