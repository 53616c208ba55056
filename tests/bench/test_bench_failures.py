"""Failed requests are counted and reported; bad input is one line on stderr and exit 2."""

from __future__ import annotations

import socket

from tests.bench.conftest import KEY
from tests.bench.fake_openai import FakeOpenAI

DECODE = {"name": "decode-3", "kind": "decode", "streams": 3, "max_tokens": 30, "runs": 2}


def one_line(run) -> str:
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert len(lines) == 1, run.stderr
    assert "Traceback" not in run.stderr and KEY not in run.stderr
    return lines[0]


def test_a_stream_that_breaks_off_is_counted_not_fatal(bench):
    # Every 4th generation dies mid-stream: the warm-up is the 1st, runs are the 2nd-7th.
    with FakeOpenAI(tok_s=300, ttft_s=0.02, fail_every=4, api_key=KEY) as fake:
        run = bench("--url", fake.url, scenarios=[DECODE])
    assert run.returncode == 0, run.stderr
    r = run.scenario("decode-3")
    assert fake.failed >= 1
    assert r["requests_failed"] == fake.failed and r["requests_ok"] == 6 - fake.failed
    assert any("engine died" in e for e in r["errors"])
    report = (run.out / "report.md").read_text()
    assert f"{fake.failed} of 6" in report and "engine died" in report
    assert "failed" in run.stderr


def test_a_request_that_times_out_is_counted(bench):
    slow = dict(DECODE, streams=1, runs=1, max_tokens=200, timeout_s=0.6)
    with FakeOpenAI(tok_s=100, ttft_s=0.02, api_key=KEY) as fake:
        run = bench("--url", fake.url, scenarios=[slow])
    assert run.returncode == 0, run.stderr
    r = run.scenario("decode-3")
    assert r["requests_failed"] == 1 and r["requests_ok"] == 0
    assert r["decode_tok_s_per_stream"] is None and "timed out" in r["errors"][0]


def test_wrong_key_is_one_line(bench):
    with FakeOpenAI(api_key=KEY) as fake:
        run = bench("--url", fake.url, key="not-the-key", scenarios=[DECODE])
        line = one_line(run)
    assert "HTTP 401" in line and "GLM_FLASH_API_KEY" in line and "not-the-key" not in line
    assert fake.generations == 0


def test_missing_key_is_one_line(bench):
    with FakeOpenAI(api_key=KEY) as fake:
        assert "HTTP 401" in one_line(bench("--url", fake.url, key=None, scenarios=[DECODE]))


def test_no_url_is_one_line(bench):
    assert "URL=" in one_line(bench(scenarios=[DECODE]))


def test_unreachable_url_is_one_line(bench):
    with socket.socket() as s:   # a port nothing listens on: bound here, never listening
        s.bind(("127.0.0.1", 0))
        line = one_line(bench("--url", f"http://127.0.0.1:{s.getsockname()[1]}", scenarios=[DECODE]))
    assert "cannot reach" in line and "refused" in line


def test_bad_url_and_unknown_suite_are_one_line(bench):
    assert "http://HOST:PORT" in one_line(bench("--url", "gpu1.lan:30000", scenarios=[DECODE]))
    assert "unknown suite" in one_line(bench("--url", "http://127.0.0.1:9", "--suite", "h100"))
