"""Speculative-decoding acceptance length from the server's Prometheus `/metrics` (docs/sources.md §11).

vLLM publishes counters (`vllm:spec_decode_num_drafts`, `..._num_accepted_tokens`); the
mean acceptance length over a run is 1 + accepted / drafts between two scrapes (each
step emits the accepted draft tokens plus one of the target model). SGLang publishes a
gauge, `sglang:spec_accept_length`, read after the run.
"""

from __future__ import annotations

import re

import requests

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfaINFA]+)")
VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SGLANG_GAUGE = "sglang:spec_accept_length"
ABSENT = (
    "the server publishes no speculative-decoding metrics at /metrics "
    "(vLLM: spec_decode counters, SGLang: spec_accept_length with --enable-metrics)"
)


def parse(text: str) -> dict[str, float]:
    """Sum of every sample per metric name, `_total` suffix dropped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1).removesuffix("_total")
        try:
            out[name] = out.get(name, 0.0) + float(m.group(3))
        except ValueError:
            continue
    return out


def scrape(url: str, headers: dict[str, str]) -> tuple[dict[str, float] | None, str]:
    try:
        r = requests.get(url.rstrip("/") + "/metrics", headers=headers, timeout=(10, 30))
    except requests.RequestException as e:
        return None, f"/metrics could not be read ({type(e).__name__})"
    if r.status_code != 200:
        return None, f"{ABSENT}; it answered HTTP {r.status_code}"
    return parse(r.text), ""


def acceptance(before: dict[str, float] | None, after: dict[str, float] | None) -> tuple[float | None, str]:
    """(acceptance length, reason when there is none)."""
    if after is None:
        return None, ABSENT
    if VLLM_DRAFTS in after and VLLM_ACCEPTED in after and before is not None:
        drafts = after[VLLM_DRAFTS] - before.get(VLLM_DRAFTS, 0.0)
        if drafts <= 0:
            return None, "the spec-decode counters did not move during the run (speculative decoding off?)"
        return 1.0 + (after[VLLM_ACCEPTED] - before.get(VLLM_ACCEPTED, 0.0)) / drafts, ""
    if SGLANG_GAUGE in after and after[SGLANG_GAUGE] > 0:
        return after[SGLANG_GAUGE], ""
    return None, ABSENT
