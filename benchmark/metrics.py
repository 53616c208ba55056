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


# KV pool: vLLM publishes its cache config as an info gauge whose labels carry num_gpu_blocks and
# block_size (tokens = their product); SGLang answers max_total_num_tokens in /get_server_info
# (docs/sources.md §11).
CACHE_INFO = re.compile(r"^vllm:cache_config_info\{([^}]*)\}", re.MULTILINE)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def cache_info_tokens(text: str) -> int | None:
    """num_gpu_blocks x block_size from vLLM's cache_config_info sample, None without one."""
    m = CACHE_INFO.search(text)
    labels = dict(LABEL.findall(m.group(1))) if m else {}
    blocks, size = labels.get("num_gpu_blocks", ""), labels.get("block_size", "")
    return int(blocks) * int(size) if blocks.isdigit() and size.isdigit() else None


def kv_pool(url: str, headers: dict[str, str]) -> tuple[int | None, str]:
    """(tokens the engine's KV pool holds, where it was read) or (None, why not)."""
    base = url.rstrip("/")
    try:
        r = requests.get(base + "/metrics", headers=headers, timeout=(10, 30))
        tokens = cache_info_tokens(r.text) if r.status_code == 200 else None
        if tokens:
            return tokens, "vllm:cache_config_info (num_gpu_blocks x block_size)"
        r = requests.get(base + "/get_server_info", headers=headers, timeout=(10, 30))
        if r.status_code == 200:
            tokens = r.json().get("max_total_num_tokens")
            if isinstance(tokens, int) and tokens > 0:
                return tokens, "/get_server_info max_total_num_tokens"
    except (requests.RequestException, ValueError, AttributeError):
        pass
    return None, "the server reports no KV pool size (vLLM: cache_config_info at /metrics; SGLang: /get_server_info)"
