"""PNG plots: decode rate against streams, and time to first token against prompt length."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; the control machine may have no display
import matplotlib.pyplot as plt  # noqa: E402


def _err(stats: list[dict]) -> list[list[float]]:
    return [[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]]


def _field(r: dict, metric: str) -> float | None:
    return next((f["value"] for f in r["field"] if f["metric"] == metric), None)


def decode(results: list[dict], path: Path, title: str) -> Path:
    rows = [r for r in results if r["kind"] == "decode" and r["decode_tok_s_per_stream"]]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    by_streams = sorted({r["streams"] for r in rows})
    if len(by_streams) > 1:
        # Stream sweep: one line per stream count, long-context rows left out (they are one point each).
        sweep = {r["streams"]: r for r in rows if (r["prompt_tokens"] or {}).get("median", 0) < 4096}
        xs = sorted(sweep)
        for metric, label, color in (
            ("decode_tok_s_total", "total", "tab:blue"),
            ("decode_tok_s_per_stream", "per stream", "tab:orange"),
        ):
            pts = [(x, sweep[x][metric]) for x in xs if sweep[x][metric]]
            if pts:
                ax.errorbar(
                    [p[0] for p in pts],
                    [p[1]["median"] for p in pts],
                    yerr=_err([p[1] for p in pts]),
                    capsize=4,
                    marker="o",
                    color=color,
                    label=f"ours, {label} (median, min-max)",
                )
            refs = [(x, _field(sweep[x], metric)) for x in xs if _field(sweep[x], metric)]
            if refs:
                ax.plot(
                    [p[0] for p in refs],
                    [p[1] for p in refs],
                    "s--",
                    color=color,
                    alpha=0.55,
                    label=f"field report, {label}",
                )
        ax.set_xlabel("concurrent streams")
        ax.set_xticks(xs)
    else:
        names = [r["name"] for r in rows]
        meds = [r["decode_tok_s_per_stream"]["median"] for r in rows]
        bars = ax.bar(
            names,
            meds,
            yerr=_err([r["decode_tok_s_per_stream"] for r in rows]),
            capsize=6,
            color="tab:blue",
            label="ours (median, min-max)",
        )
        ax.bar_label(bars, labels=[f"{m:.1f}" for m in meds], label_type="center", color="white")
        labelled = False
        for i, r in enumerate(rows):
            ref = _field(r, "decode_tok_s_per_stream")
            if ref:
                ax.hlines(
                    ref, i - 0.4, i + 0.4, colors="tab:red", linestyles="--", label=None if labelled else "field report"
                )
                ax.annotate(f"{ref:g}", (i + 0.4, ref), textcoords="offset points", xytext=(2, -4), color="tab:red")
                labelled = True
    ax.set_ylabel("decode tokens per second")
    return _finish(fig, ax, path, f"Decode rate — {title}")


def prefill(results: list[dict], path: Path, title: str) -> Path:
    rows = [r for r in results if r["ttft_s"] and r["prompt_tokens"] and r["streams"] == 1]
    rows.sort(key=lambda r: r["prompt_tokens"]["median"])
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    xs = [r["prompt_tokens"]["median"] / 1000 for r in rows]
    ax.errorbar(
        xs,
        [r["ttft_s"]["median"] for r in rows],
        yerr=_err([r["ttft_s"] for r in rows]),
        capsize=4,
        marker="o",
        color="tab:blue",
        label="ours (median, min-max)",
    )
    for r, x in zip(rows, xs):
        ax.annotate(r["name"], (x, r["ttft_s"]["median"]), textcoords="offset points", xytext=(6, 6), fontsize=8)
    refs = [(x, _field(r, "ttft_s")) for r, x in zip(rows, xs) if _field(r, "ttft_s")]
    rate_refs = [
        (x, x * 1000 / _field(r, "prefill_tok_s"))
        for r, x in zip(rows, xs)
        if _field(r, "prefill_tok_s") and not _field(r, "ttft_s")
    ]
    pts = sorted(refs + rate_refs)
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "s", color="tab:red", label="field report")
    ax.set_xlabel("prompt length (thousand tokens, the server's count)")
    ax.set_ylabel("seconds to first token")
    ax.set_xlim(left=0)
    return _finish(fig, ax, path, f"Time to first token — {title}")


def _finish(fig, ax, path: Path, title: str) -> Path:
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
