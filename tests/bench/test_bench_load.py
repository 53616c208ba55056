"""A prefill measured under concurrent decodes, and the KV pool size the server reports."""

from __future__ import annotations

from tests.bench.conftest import KEY
from tests.bench.fake_openai import FakeOpenAI

UNDER_LOAD = {
    "name": "prefill-2k-under-3-decodes",
    "kind": "prefill",
    "prompt_tokens": 2000,
    "max_tokens": 4,
    "runs": 1,
    "background_decodes": 3,
    "background_tokens": 120,
    "refs": [{"metric": "ttft_s", "value": 80.0, "text": "~80 s under 8 concurrent decodes (L40S report)"}],
}


def test_prefill_under_decodes_and_the_kv_pool(bench):
    with FakeOpenAI(tok_s=100, ttft_s=0.05, prefill_tok_s=10000, api_key=KEY, kv_tokens=2110000) as fake:
        run = bench("--url", fake.url, scenarios=[UNDER_LOAD])
        peak = fake.peak
    assert run.returncode == 0, run.stderr
    r = run.scenario("prefill-2k-under-3-decodes")
    assert r["requests_ok"] == 1 and r["requests_failed"] == 0  # the measured request only
    assert peak == 4  # three decodes and the prefill in flight together (the warm-up ran alone)
    cal = run.results["calibration"]
    assert cal["kv_pool_tokens"] == 2110000 and "max_total_num_tokens" in cal["kv_pool_source"]
    assert "KV pool: 2,110,000 tokens" in (run.out / "report.md").read_text()
