"""Reported rates and times match what the fake server was set to (within TIMING_TOL, conftest.py:
wide enough for a loaded machine, narrow enough to fail a factor of 2)."""

from __future__ import annotations

from tests.bench.conftest import KEY, near
from tests.bench.fake_openai import FakeOpenAI

TOK_S, TTFT_S, PREFILL_TOK_S = 120.0, 0.25, 12000.0
SCENARIOS = [
    {"name": "decode-1", "kind": "decode", "streams": 1, "max_tokens": 60, "runs": 2,
     "refs": [{"metric": "decode_tok_s_per_stream", "value": 100.0, "text": "100 tok/s (test)"}]},
    {"name": "decode-8", "kind": "decode", "streams": 8, "max_tokens": 60, "runs": 2,
     "refs": [{"metric": "decode_tok_s_total", "value": 800.0, "text": "800 tok/s total (test)"}]},
    {"name": "decode-long", "kind": "decode", "streams": 1, "prompt_tokens": 2500, "max_tokens": 40, "runs": 1},
    {"name": "prefill-3k", "kind": "prefill", "prompt_tokens": 3000, "max_tokens": 4, "runs": 2,
     "refs": [{"metric": "ttft_s", "value": 0.5, "text": "0.5 s (test)"},
              {"metric": "prefill_tok_s", "value": 6000.0, "text": "6000 tok/s (test)"}]},
]


def test_decode_prefill_and_ttft_match_the_set_rates(bench):
    # chunk=3: several tokens per event, as a server with speculative decoding sends them.
    with FakeOpenAI(tok_s=TOK_S, ttft_s=TTFT_S, prefill_tok_s=PREFILL_TOK_S, chunk=3, api_key=KEY) as fake:
        run = bench("--url", fake.url, scenarios=SCENARIOS)
    assert run.returncode == 0, run.stderr
    for name, streams in (("decode-1", 1), ("decode-8", 8), ("decode-long", 1)):
        r = run.scenario(name)
        assert r["requests_ok"] == streams * (2 if name != "decode-long" else 1) and r["requests_failed"] == 0
        assert near(r["decode_tok_s_per_stream"]["median"], TOK_S), r
        assert near(r["decode_tok_s_total"]["median"], TOK_S * streams), r
        assert r["output_tokens"]["median"] == SCENARIOS[[s["name"] for s in SCENARIOS].index(name)]["max_tokens"]
        expected_ttft = TTFT_S + r["prompt_tokens"]["median"] / PREFILL_TOK_S
        assert near(r["ttft_s"]["median"], expected_ttft), r
    long = run.scenario("decode-long")
    assert near(long["prompt_tokens"]["median"], 2500, 0.05), long
    pre = run.scenario("prefill-3k")
    # Calibration: the server's own count hits the wanted length.
    assert near(pre["prompt_tokens"]["median"], 3000, 0.03), pre
    expected = TTFT_S + pre["prompt_tokens"]["median"] / PREFILL_TOK_S
    assert near(pre["ttft_s"]["median"], expected), pre
    assert near(pre["prefill_tok_s"]["median"], pre["prompt_tokens"]["median"] / expected), pre


def test_requests_are_what_the_bench_promises(bench):
    with FakeOpenAI(tok_s=400, ttft_s=0.02, api_key=KEY) as fake:
        run = bench("--url", fake.url, scenarios=[SCENARIOS[1], dict(SCENARIOS[3], runs=3)])
    assert run.returncode == 0, run.stderr
    streamed = [b for b in fake.bodies if b.get("stream")]
    assert all(b["temperature"] == 0 and b["ignore_eos"] is True for b in streamed)
    assert all(b["stream_options"] == {"include_usage": True} for b in streamed)
    assert any("messages" in b for b in streamed) and any("prompt" in b for b in streamed)
    # Unique prompts from their first characters on: the prefix cache cannot help.
    long_prompts = [p for p in fake.prompts if len(p) > 5000]
    assert len(long_prompts) >= 4
    assert len({p[:48] for p in long_prompts}) == len(long_prompts)
    for where in (run.stderr, run.stdout, (run.out / "results.json").read_text(), (run.out / "report.md").read_text()):
        assert KEY not in where


def test_without_usage_in_the_stream_events_are_counted(bench):
    with FakeOpenAI(tok_s=TOK_S, ttft_s=TTFT_S, usage=False, api_key=KEY) as fake:
        run = bench("--url", fake.url, scenarios=SCENARIOS[:2])
    assert run.returncode == 0, run.stderr
    for name in ("decode-1", "decode-8"):
        r = run.scenario(name)
        assert r["usage_in_stream"] is False and r["prompt_tokens_estimated"] is True
        assert r["output_tokens"]["median"] == 60
        assert near(r["decode_tok_s_per_stream"]["median"], TOK_S), r
        assert near(r["ttft_s"]["median"], TTFT_S), r
    assert "calibration" in (run.out / "report.md").read_text()


def test_a_stream_without_chunked_encoding_is_timed_as_it_arrives(bench):
    # Events of ~150 bytes at 20 a second: a reader that waits for 512 bytes (requests'
    # iter_lines) would see the first token about 0.15 s late (60% of TTFT_S: outside TIMING_TOL).
    with FakeOpenAI(tok_s=20, ttft_s=TTFT_S, chunked=False, api_key=KEY) as fake:
        run = bench("--url", fake.url, scenarios=[dict(SCENARIOS[0], runs=1, max_tokens=12)])
    assert run.returncode == 0, run.stderr
    r = run.scenario("decode-1")
    assert near(r["ttft_s"]["median"], TTFT_S) and near(r["decode_tok_s_per_stream"]["median"], 20), r


def test_the_quick_suite_as_the_host_check_runs_it(bench):
    with FakeOpenAI(tok_s=400, ttft_s=0.02, prefill_tok_s=100000, chunk=4, accept_len=5.0, api_key=KEY) as fake:
        run = bench("--url", fake.url, "--suite", "quick", "--platform", "gb10", "--model", "glm-5.3-flash",
                    "--api-key-env", "GLM_FLASH_API_KEY")
    assert run.returncode == 0, run.stderr
    one = run.scenario("decode-1")
    assert [f["value"] for f in one["field"]] == [29.0] and near(one["accept_len"]["median"], 5.0, 0.05)
    assert near(one["decode_tok_s_per_stream"]["median"], 400)
    assert near(run.scenario("prefill-4k")["prompt_tokens"]["median"], 4096, 0.03)
    assert {b["model"] for b in fake.bodies} == {"glm-5.3-flash"}


def test_near_tells_a_factor_of_two():
    """The timing tolerance must still fail a bench that is off by 2x either way."""
    assert near(1.3, 1.0) and near(0.7, 1.0)
    assert not near(2.0, 1.0) and not near(0.5, 1.0)
