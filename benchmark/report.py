"""results.json and report.md: our medians beside the field reports' numbers.

The ratio is always "ours relative to the report, above 1 is better": ours / field for
rates and the acceptance length, field / ours for time to first token.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmark.suites import Scenario

UNITS = {
    "decode_tok_s_per_stream": "tok/s per stream",
    "decode_tok_s_total": "tok/s total",
    "prefill_tok_s": "prefill tok/s",
    "ttft_s": "s to first token",
    "accept_len": "acceptance length",
}
MAIN = {"decode": "decode_tok_s_per_stream", "prefill": "prefill_tok_s"}


def ratio(metric: str, ours: float | None, field: float) -> float | None:
    if not ours:
        return None
    return round(field / ours if metric == "ttft_s" else ours / field, 3)


def attach_refs(results: list[dict], scenarios: list[Scenario]) -> None:
    by_name = {sc.name: sc for sc in scenarios}
    for r in results:
        r["field"] = [
            {
                "metric": ref.metric,
                "value": ref.value,
                "text": ref.text,
                "ratio": ratio(ref.metric, (r.get(ref.metric) or {}).get("median"), ref.value),
            }
            for ref in by_name[r["name"]].refs
        ]


def write_json(out: Path, meta: dict, results: list[dict]) -> Path:
    path = out / "results.json"
    path.write_text(json.dumps(dict(meta, scenarios=results), indent=2) + "\n")
    return path


def _fmt(s: dict | None, metric: str) -> str:
    if not s:
        return "—"
    digits = 2 if metric in ("ttft_s", "accept_len") else 1
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def rows(r: dict) -> list[list[str]]:
    failed = f"{r['requests_failed']} of {r['requests_ok'] + r['requests_failed']}"
    pt = f"{r['prompt_tokens']['median']:.0f}" if r.get("prompt_tokens") else "—"
    base = [r["name"], str(r["streams"]), pt]
    out = []
    for f in r["field"]:
        ours = r.get(f["metric"])
        out.append(
            base
            + [
                UNITS[f["metric"]],
                _fmt(ours, f["metric"]),
                f["text"],
                f"{f['ratio']:.2f}" if f["ratio"] is not None else "—",
                failed,
            ]
        )
    if not r["field"]:
        for metric in (MAIN[r["kind"]],) + (("decode_tok_s_total",) if r["streams"] > 1 else ()):
            out.append(base + [UNITS[metric], _fmt(r.get(metric), metric), "—", "—", failed])
    if r.get("accept_len") and not any(f["metric"] == "accept_len" for f in r["field"]):
        out.append(base + [UNITS["accept_len"], _fmt(r["accept_len"], "accept_len"), "—", "—", failed])
    if "accept_len_skipped" in r:
        out.append(base + [UNITS["accept_len"], "skipped", r["accept_len_skipped"], "—", failed])
    return out


def write_markdown(out: Path, meta: dict, results: list[dict], plots: list[str]) -> Path:
    lines = [
        f"# Bench: {meta['host']} ({meta['suite']} suite)",
        "",
        f"{meta['started']} · `{meta['url']}` · model `{meta['model']}` · field numbers from docs/sources.md §1",
        "",
        "| scenario | streams | prompt tokens | metric | ours: median (min–max) | field report | ratio | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for row in rows(r):
            lines.append("| " + " | ".join(row) + " |")
    cal = meta.get("calibration") or {}
    kv = cal.get("kv_pool_tokens")
    lines += [
        "",
        (
            f"KV pool: {kv:,} tokens ({cal.get('kv_pool_source')})"
            if kv
            else f"KV pool: unknown ({cal.get('kv_pool_source', 'not read')})"
        )
        + "; L40S report: 2.11M tokens (fp8_e4m3), GB10 report: 6.2-7.5 GiB of KV cache.",
        "",
        "Ratio: ours relative to the field report, above 1 is better "
        "(ours / field; field / ours for time to first token).",
    ]
    if any(r.get("prompt_tokens_estimated") for r in results):
        lines.append("Prompt tokens marked from calibration: the server sent no usage in the stream.")
    errors = [(r["name"], e) for r in results for e in r["errors"]]
    if errors:
        lines += ["", "## Failed requests", ""] + [f"- {n}: {e}" for n, e in errors]
    lines += [""] + [f"![{Path(p).stem}]({Path(p).name})" for p in plots]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
