"""The deployed node still answers well: the eval's floor suite (21 fixed HumanEval problems), held
to pass@1 >= 0.8 (benchmark/evaluate.py FLOOR; the GB10 report's node and the original both pass
about 95-97% of all 164, docs/sources.md §1). GPU hosts only; the engine is reached as
tests/host/test_bench.py reaches it (directly, or an SSH tunnel to the node's own 127.0.0.1).
The model's code runs on the control machine, in bubblewrap (benchmark/confine.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.host.test_bench import engine_url

REPO = Path(__file__).resolve().parents[2]


def floor_run(
    url: str, model: str, key_env: str, out: Path, extra: tuple[str, ...] = ()
) -> tuple[int, str, dict | None]:
    """(exit status, stderr, results.json or None) of `make eval SUITE=floor` against `url`."""
    done = subprocess.run(
        [str(REPO / ".venv-bench/bin/python"), "-m", "benchmark.evaluate", "--url", url, "--suite", "floor",
         "--model", model, "--api-key-env", key_env, "--plus", "off", "--out", str(out), *extra],
        cwd=REPO, capture_output=True, text=True, timeout=3600, env=dict(os.environ),
    )  # fmt: skip
    results = out / "results.json"
    return done.returncode, done.stderr, json.loads(results.read_text()) if results.exists() else None


def floor_failure(code: int, stderr: str, results: dict | None) -> str | None:
    """Why the floor check fails, None when it holds."""
    if code == 2 or results is None:
        return f"the eval could not run: {stderr.strip()[-1500:]}"
    floor = results["floor"]
    if code != 0 or not floor["met"]:
        he = results["endpoints"]["a"]["humaneval"]
        failed = [f"{t}: {v['reason']}" for t, v in he["items"].items() if not v["passed"]]
        return f"pass@1 {he['passed']}/{he['total']} is below the floor {floor['floor']}: " + "; ".join(failed)[:1500]
    return None


@pytest.mark.gpu
def test_floor_suite_passes_on_the_node(host, profile, tmp_path):
    with engine_url(host, profile) as url:
        result = floor_run(url, profile.served_model_name, profile.api_key_env, tmp_path / "eval")
    why = floor_failure(*result)
    assert why is None, f"{why} (report: {tmp_path / 'eval' / 'report.md'})"
