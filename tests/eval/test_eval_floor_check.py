"""The node's quality-floor host check (tests/host/test_eval.py) decided against stand-ins: it runs
only on GPU hosts, so what it concludes from an eval run is proven here, on a server that answers
well, one that does not, and one that is not there."""

from __future__ import annotations

import os

from tests.bench.conftest import KEY
from tests.bench.fake_openai import FakeOpenAI
from tests.eval.conftest import right, task_of, wrong
from tests.host.test_eval import floor_failure, floor_run

BROKEN = {"HumanEval/8", "HumanEval/16", "HumanEval/24", "HumanEval/32", "HumanEval/40"}  # 16 of 21 left


def test_floor_check_against_stand_ins(problems, bench_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("GLM_FLASH_API_KEY", KEY)

    def answer(bad):
        def a(text):
            tid = task_of(text, problems)
            return wrong(problems[tid]) if tid in bad else right(problems[tid])

        return a

    with FakeOpenAI(api_key=KEY, answer=answer(set())) as good, FakeOpenAI(api_key=KEY, answer=answer(BROKEN)) as bad:
        assert floor_failure(*floor_run(good.url, "glm-5.3-flash", "GLM_FLASH_API_KEY", tmp_path / "good")) is None
        why = floor_failure(*floor_run(bad.url, "glm-5.3-flash", "GLM_FLASH_API_KEY", tmp_path / "bad"))
    assert why.startswith("pass@1 16/21 is below the floor 0.8") and "HumanEval/32: ValueError: wrong on purpose" in why
    gone = floor_failure(*floor_run("http://127.0.0.1:9", "glm-5.3-flash", "GLM_FLASH_API_KEY", tmp_path / "gone"))
    assert gone.startswith("the eval could not run") and "cannot reach http://127.0.0.1:9" in gone
    assert "GLM_FLASH_API_KEY" in os.environ
