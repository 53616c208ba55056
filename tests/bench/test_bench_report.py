"""results.json, report.md and the plots of a GB10-like run (speculative decoding metrics)."""

from __future__ import annotations

import json
import os
import struct
import subprocess

import pytest

from tests.bench.conftest import KEY, REPO, Run, near
from tests.bench.fake_openai import FakeOpenAI

FIELDS = ("name", "streams", "prompt_tokens", "output_tokens", "ttft_s", "decode_tok_s_per_stream",
          "decode_tok_s_total", "prefill_tok_s", "requests_ok", "requests_failed")
STATS = ("prompt_tokens", "output_tokens", "ttft_s", "decode_tok_s_per_stream", "decode_tok_s_total", "prefill_tok_s")
GB10_LIKE = [
    {"name": "decode-code", "kind": "decode", "max_tokens": 56, "runs": 2, "style": "code", "spec": True,
     "refs": [{"metric": "decode_tok_s_per_stream", "value": 29.0, "text": "~29 tok/s on code (GB10 report)"},
              {"metric": "accept_len", "value": 5.5, "text": "5.5 with DFlash2 k=7 (GB10 report)"}]},
    {"name": "decode-prose", "kind": "decode", "max_tokens": 56, "runs": 1, "style": "prose", "spec": True},
    {"name": "prefill-2k", "kind": "prefill", "prompt_tokens": 2000, "max_tokens": 4, "runs": 1,
     "refs": [{"metric": "ttft_s", "value": 313.0, "text": "313 s on 198K (GB10 report)"}]},
]


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def gb10_run(bench_venv, tmp_path_factory):
    out = tmp_path_factory.mktemp("gb10")
    suite = out / "suite.json"
    suite.write_text(json.dumps({"scenarios": GB10_LIKE}))
    with FakeOpenAI(tok_s=90, ttft_s=0.05, prefill_tok_s=20000, chunk=5, accept_len=5.0, api_key=KEY) as fake:
        done = subprocess.run([str(bench_venv), "-m", "benchmark", "--url", fake.url, "--suite", str(suite),
                               "--out", str(out / "result")], cwd=REPO, capture_output=True, text=True, timeout=180,
                              env=dict(os.environ, GLM_FLASH_API_KEY=KEY))
    return Run(done.returncode, done.stdout, done.stderr, out / "result")


def test_results_json_has_every_field(gb10_run):
    assert gb10_run.returncode == 0, gb10_run.stderr
    results = gb10_run.results
    assert results["url"].startswith("http://127.0.0.1:") and results["model"] == "glm-5.3-flash"
    for r in results["scenarios"]:
        assert set(FIELDS) <= set(r), r
        assert r["requests_ok"] >= 1 and r["requests_failed"] == 0
        for key in STATS:
            assert set(r[key]) == {"median", "min", "max"}, (r["name"], key, r[key])
            assert 0 < r[key]["min"] <= r[key]["median"] <= r[key]["max"]


def test_acceptance_length_comes_from_metrics(gb10_run):
    code = gb10_run.scenario("decode-code")
    assert near(code["accept_len"]["median"], 5.0, 0.05), code
    assert near(code["decode_tok_s_per_stream"]["median"], 90.0)


def _ratio(r: dict, metric: str) -> float:
    return next(f["ratio"] for f in r["field"] if f["metric"] == metric)


def test_report_has_field_numbers_and_ratios(gb10_run):
    report = (gb10_run.out / "report.md").read_text()
    code, prefill = gb10_run.scenario("decode-code"), gb10_run.scenario("prefill-2k")
    expected = [(code, "decode_tok_s_per_stream", code["decode_tok_s_per_stream"]["median"] / 29.0),
                (code, "accept_len", code["accept_len"]["median"] / 5.5),
                (prefill, "ttft_s", 313.0 / prefill["ttft_s"]["median"])]   # a shorter wait is better
    for r, metric, want in expected:
        assert _ratio(r, metric) == pytest.approx(want, abs=1e-3)
        assert f"| {_ratio(r, metric):.2f} |" in report
    assert "~29 tok/s on code (GB10 report)" in report and "5.5 with DFlash2 k=7" in report
    assert "313 s on 198K (GB10 report)" in report and "docs/sources.md §1" in report
    assert "![decode](decode.png)" in report and "![prefill](prefill.png)" in report
    # no cache_config_info at its /metrics, no /get_server_info: the KV pool is unknown, and says where it looked
    assert gb10_run.results["calibration"]["kv_pool_tokens"] is None
    assert "KV pool: unknown (the server reports no KV pool size" in report


def test_plots_are_png_files(gb10_run):
    for name in ("decode.png", "prefill.png"):
        width, height = png_size(gb10_run.out / name)
        assert width >= 400 and height >= 300


def test_without_metrics_acceptance_is_skipped_with_a_reason(bench):
    with FakeOpenAI(tok_s=300, ttft_s=0.02, api_key=KEY) as fake:
        run = bench("--url", fake.url, scenarios=[dict(GB10_LIKE[0], runs=1)])
    assert run.returncode == 0, run.stderr
    r = run.scenario("decode-code")
    assert r["accept_len"] is None and "no speculative-decoding metrics" in r["accept_len_skipped"]
    assert "skipped" in (run.out / "report.md").read_text()
