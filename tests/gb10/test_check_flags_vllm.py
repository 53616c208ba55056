"""files/glm-flash-check-flags on the GB10 engine: the real vLLM 0.24.0 parser, and the fork's settings.

The tool runs with the cached vLLM 0.24.0 parser venv's python (tests/gb10/vllm_wheel.py), as the
deploy runs it with the engine environment's. Simulated: the GPU (cpu_platform/sitecustomize.py sets
vLLM's CPU platform). The venv holds the release without the fork's patch, which is the broken case
the environment check exists for: it must name VLLM_MOE_W2*, which only the patch reads. That the
patched engine passes is shown on a stand-in package holding the fork's reads (the lines of its
patch at the pinned commit that read them, docs/sources.md §20, written as ours).
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sysconfig
from pathlib import Path

import pytest
from vllm_wheel import parser_python

from control.profile import build
from roles.engines.vllm import launch as vllm_launch

HERE = Path(__file__).resolve().parent
TOOL = HERE.parents[1] / "files" / "glm-flash-check-flags"
GB10 = {"platform": "gb10", "vllm_ref": "0123456789abcdef0123456789abcdef01234567", "accept_drafter_license": True}


@pytest.fixture(scope="module")
def profile():
    return build("gx10.example.lan", GB10, api_key_present=True)


def check(spec: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(HERE / "cpu_platform"))
    return subprocess.run(
        [str(parser_python()), str(TOOL), "--args-json", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def test_the_deploys_flags_pass_vllm_0_24s_parser(profile):
    spec = vllm_launch.launch_spec(profile)
    r = check({k: spec[k] for k in ("module", "args", "api_key_flag")} | {"env": ["VLLM_NO_USAGE_STATS"]})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ok: ") and "(vllm 0.24.0)" in r.stdout


def test_an_unknown_flag_and_the_unpatched_release_are_refused(profile):
    spec = vllm_launch.launch_spec(profile)
    r = check(
        {
            "module": spec["module"],
            "args": spec["args"] + ["--mamba-cache-modes", "align"],
            "env": vllm_launch.engine_env_names(profile),
        }
    )
    assert r.returncode == 1, (r.stdout, r.stderr[-2000:])
    said = r.stderr
    assert "unknown flag --mamba-cache-modes (did you mean --mamba-cache-mode?)" in said
    for name in ("VLLM_MOE_W2", "VLLM_MOE_W2_DELTA_GB", "VLLM_MOE_W2_CUBIT_DIR", "VLLM_MOE_W2_GATE"):
        assert f"environment {name}: no file of the installed vllm reads it" in said, said
    assert "environment VLLM_NO_USAGE_STATS" not in said  # vLLM's own, read by vllm/envs.py


def test_the_patched_engine_reads_the_fork_settings(tmp_path, monkeypatch):
    tool = runpy.run_path(str(TOOL))
    site = tmp_path / "site"
    pkg = site / "vllm" / "model_executor"
    pkg.mkdir(parents=True)
    # how the fork's patch reads them (vllm-moet-v0.24.0.patch at d358bad: os.getenv("NAME", default))
    (pkg / "moe_w2.py").write_text(
        'import os\n_ON = os.getenv("VLLM_MOE_W2", "0") == "1"\n_GB = os.getenv(\'VLLM_MOE_W2_DELTA_GB\', "2.0")\n'
    )
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.py").write_text('"VLLM_MOE_W2_GATE"')  # byte-code dirs are not the engine
    real = sysconfig.get_paths
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: dict(real(*a, **k), purelib=str(site)))
    names = ["VLLM_MOE_W2", "VLLM_MOE_W2_DELTA_GB", "VLLM_MOE_W2_GATE"]
    assert tool["unread_env"]("vllm.entrypoints.openai.api_server", names) == ["VLLM_MOE_W2_GATE"]
