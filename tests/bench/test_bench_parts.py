"""The bench's pure parts: Prometheus parsing, acceptance length, calibration, suites."""

from __future__ import annotations

import json

import pytest

from benchmark import metrics, prompts, suites

VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="glm"} 100.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="glm"} 700.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="glm"} 450.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="glm",position="0"} 90.0
"""


def test_acceptance_length_from_vllm_counters():
    before = metrics.parse(VLLM_METRICS)
    after = metrics.parse(VLLM_METRICS.replace("100.0", "300.0").replace("450.0", "1350.0"))
    value, reason = metrics.acceptance(before, after)
    assert value == pytest.approx(1 + 900 / 200) and reason == ""


def test_acceptance_from_sglang_gauge_and_reasons_when_absent():
    assert metrics.acceptance({}, metrics.parse("sglang:spec_accept_length{model_name=\"g\"} 3.25\n"))[0] == 3.25
    assert metrics.acceptance(None, None)[1] == metrics.ABSENT
    assert metrics.acceptance({}, metrics.parse("process_cpu_seconds_total 3.0\n"))[1] == metrics.ABSENT
    still = metrics.parse(VLLM_METRICS)
    assert "did not move" in metrics.acceptance(still, still)[1]


def test_calibration_sizes_text_in_server_tokens():
    cal = prompts.Calibration.fit((500, 150), (5000, 1275))  # 0.25 tokens per char, 25 overhead
    assert cal.per_char == pytest.approx(0.25) and cal.overhead == pytest.approx(25)
    assert cal.chars_for(68000) == round((68000 - 25) / 0.25)
    with pytest.raises(ValueError):
        prompts.Calibration.fit((500, 150), (5000, 150))


def test_prefill_prompts_are_unique_and_sized():
    cal = prompts.Calibration(overhead=10, per_char=0.25)
    a, b = (prompts.prefill_prompt("prose", 4000, cal) for _ in range(2))
    assert a[:40] != b[:40]
    assert abs(len(a) - cal.chars_for(4000)) <= 1
    assert "def " in prompts.filler(500, "code") and "def " not in prompts.filler(500, "prose")


def test_builtin_suites_hold_the_field_numbers():
    l40s = {s.name: s for s in suites.load("l40s", "l40s")}
    assert [l40s[f"decode-{n}"].streams for n in (1, 8, 16, 24)] == [1, 8, 16, 24]
    assert l40s["decode-1"].refs[0].value == 18.3 and l40s["prefill-68k"].prompt_tokens == 68000
    assert {r.metric: r.value for r in l40s["prefill-68k"].refs} == {"ttft_s": 69.7, "prefill_tok_s": 975.6}
    loaded = l40s["prefill-68k-under-8-decodes"]
    assert (loaded.prompt_tokens, loaded.background_decodes, loaded.refs[0].value) == (68000, 8, 80.0)
    gb10 = {s.name: s for s in suites.load("gb10", "gb10")}
    assert gb10["prefill-198k"].prompt_tokens == 198000 and gb10["prefill-70k"].prompt_tokens == 70000
    assert {r.metric: r.value for r in gb10["decode-code"].refs} == {"decode_tok_s_per_stream": 29.0, "accept_len": 5.5}
    assert suites.load("quick", "gb10")[0].refs[0].value == 29.0
    assert suites.load("quick", "l40s")[0].refs[0].value == 18.3


def test_suite_files_are_checked(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"scenarios": [{"name": "x", "kind": "decode", "stream": 2}]}))
    with pytest.raises(ValueError, match="unknown field"):
        suites.load(str(bad), "l40s")


def test_kv_pool_from_vllm_cache_config_info():
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
        'gpu_memory_utilization="0.9",num_cpu_blocks="0",num_gpu_blocks="29467"} 1.0\n'
    )
    assert metrics.cache_info_tokens(text) == 29467 * 16
    assert metrics.cache_info_tokens(VLLM_METRICS) is None
