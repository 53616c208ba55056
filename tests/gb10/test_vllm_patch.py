"""patches/vllm/0.33.0.yaml through the real patch tool, on the real scheduler.py of the
vLLM 0.33.0 wheel from PyPI (tests/vllm/vllm_wheel.py: cached, sha256-checked).

The tool runs as a subprocess, as on a host: files/glm-flash-patch check|apply SET.json
--root <site-packages>, state under a temporary GLM_FLASH_STATE_DIR.
"""

from __future__ import annotations

import ast
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from vllm_wheel import SCHEDULER, scheduler_source

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "files" / "glm-flash-patch"
SET = REPO / "patches" / "vllm" / "0.33.0.yaml"


@pytest.fixture(scope="module")
def original() -> str:
    return scheduler_source()


@pytest.fixture
def site(tmp_path, original, monkeypatch):
    """A site-packages holding the wheel's scheduler.py, the set as JSON, a state dir."""
    root = tmp_path / "site-packages"
    f = root / SCHEDULER
    f.parent.mkdir(parents=True)
    f.write_text(original)
    pset = tmp_path / "vllm-0.33.0.json"
    pset.write_text(json.dumps(yaml.safe_load(SET.read_text())))
    state = tmp_path / "state"
    return {"root": root, "file": f, "set": pset, "state": state}


def run(site, action, *extra):
    env = dict(os.environ, GLM_FLASH_STATE_DIR=str(site["state"]))
    return subprocess.run(
        [sys.executable, str(TOOL), action, str(site["set"]), "--root", str(site["root"]), "--json", *extra],
        capture_output=True,
        text=True,
        env=env,
    )


def state_of(result, site) -> str:
    return json.loads(result.stdout.splitlines()[0])[str(site["file"])]["state"]


def block_size_source(text: str) -> str:
    """The expression `block_size` is assigned from first in _mamba_block_aligned_split."""
    tree = ast.parse(text)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Scheduler"):
        for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_mamba_block_aligned_split"):
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["block_size"]:
                    return ast.unparse(node.value)
    raise AssertionError("no `block_size = ...` in Scheduler._mamba_block_aligned_split")


def test_the_wheel_has_the_bug_where_research_says(original):
    assert block_size_source(original) == "self.cache_config.block_size"
    line = original.splitlines().index("        block_size = self.cache_config.block_size") + 1
    assert line == 572


def test_applies_then_reapplies_as_a_no_op(site, original):
    assert state_of(run(site, "check"), site) == "pending"
    assert run(site, "check").returncode == 1
    first = run(site, "apply")
    assert first.returncode == 0, first.stderr
    patched = site["file"].read_text()
    assert patched != original
    # the original is kept once, the manifest names the edit
    backup = site["state"] / "originals" / str(site["file"]).lstrip("/")
    assert backup.read_text() == original
    manifest = json.loads((site["state"] / "manifests" / "vllm-0.33.0-gb10.json").read_text())
    assert manifest["files"][str(site["file"])]["edits"] == ["mamba-group-block-size"]
    mtime = site["file"].stat().st_mtime_ns
    again = run(site, "apply")
    assert again.returncode == 0 and state_of(again, site) == "applied"
    assert "patched " not in again.stdout
    assert site["file"].read_text() == patched and site["file"].stat().st_mtime_ns == mtime
    assert run(site, "check").returncode == 0


def test_patched_file_compiles_and_takes_the_mamba_group_block_size(site):
    assert run(site, "apply").returncode == 0
    py_compile.compile(str(site["file"]), doraise=True)
    text = site["file"].read_text()
    source = block_size_source(text)
    assert "self.kv_cache_config.kv_cache_groups" in source
    assert "isinstance(group.kv_cache_spec, MambaSpec)" in source
    assert "group.kv_cache_spec.block_size" in source
    # every other use in the function still reads the local (L579, L601, L617, L621, L634)
    tree = ast.parse(text)
    fn = next(
        n
        for c in tree.body
        if isinstance(c, ast.ClassDef) and c.name == "Scheduler"
        for n in c.body
        if isinstance(n, ast.FunctionDef) and n.name == "_mamba_block_aligned_split"
    )
    assert "self.cache_config.block_size" not in ast.unparse(fn).replace(source, "")
    # MambaSpec is imported at module level in 0.33.0, so the name resolves
    assert any(
        isinstance(n, ast.ImportFrom)
        and n.module == "vllm.v1.kv_cache_interface"
        and "MambaSpec" in [a.name for a in n.names]
        for n in tree.body
    )


def test_patched_choice_picks_the_mamba_group(site):
    """Run the patched expression itself against stand-in config objects."""
    assert run(site, "apply").returncode == 0
    expr = block_size_source(site["file"].read_text())

    class MambaSpec:
        def __init__(self, block_size):
            self.block_size = block_size

    class Attention:  # any other spec (full attention, the drafter's layers)
        def __init__(self, block_size):
            self.block_size = block_size

    def scheduler(groups, page):
        ns = type("S", (), {})()
        ns.kv_cache_config = type(
            "K", (), {"kv_cache_groups": [type("G", (), {"kv_cache_spec": g})() for g in groups]}
        )()
        ns.cache_config = type("C", (), {"block_size": page})()
        return ns

    env = {"MambaSpec": MambaSpec}
    # DFlash2 lowered the attention page to 16; the KDA group checkpoints every 7168
    assert eval(expr, env, {"self": scheduler([Attention(16), MambaSpec(7168)], 16)}) == 7168
    # no Mamba group: the old value
    assert eval(expr, env, {"self": scheduler([Attention(16)], 16)}) == 16


def test_drifted_file_is_refused_and_left_alone(site, original):
    drifted = original.replace(
        "        block_size = self.cache_config.block_size\n",
        "        block_size = self.cache_config.block_size or 16\n",
    )
    site["file"].write_text(drifted)
    r = run(site, "apply")
    assert r.returncode == 2
    assert "refused" in r.stderr and "vllm 0.33.0" in r.stderr
    assert site["file"].read_text() == drifted
    assert not (site["state"] / "originals").exists()


def test_source_that_already_has_a_fix_is_detected_not_patched(site, original):
    """A fork/upstream fix named by fixed_upstream_if is 'upstream': nothing written."""
    fixed = original.replace(
        "        block_size = self.cache_config.block_size\n", "        block_size = self.mamba_block_size\n"
    )
    site["file"].write_text(fixed)
    r = run(site, "apply")
    assert r.returncode == 0 and state_of(r, site) == "upstream"
    assert site["file"].read_text() == fixed
