"""Scenarios as data: what each suite runs and which field-report number each row is held to.

The numbers are the field reports' (docs/sources.md §1). The GB10 box serves one stream
(`max_num_seqs` 1), so its suite has no multi-stream rows: the report has none either.
A suite can also come from a JSON file (`--suite my.json`): {"scenarios": [{...}, ...]} with
the fields of `Scenario`, refs as [{"metric": ..., "value": ..., "text": ...}].
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

# Metrics a ref can compare; for ttft_s lower is better, so the ratio is field / ours.
METRICS = ("decode_tok_s_per_stream", "decode_tok_s_total", "prefill_tok_s", "ttft_s", "accept_len")


@dataclass(frozen=True)
class Ref:
    metric: str
    value: float
    text: str


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str  # "decode": short prompt, fixed output; "prefill": long prompt, time to first token
    streams: int = 1
    prompt_tokens: int = 64
    max_tokens: int = 256
    runs: int = 3  # after one warm-up
    style: str = "prose"  # "prose" or "code": what the prompt asks for
    spec: bool = False  # read the speculative-decoding acceptance length from /metrics
    background_decodes: int = 0  # decode streams running while each measured request runs
    background_tokens: int = 512  # each background stream's max_tokens (long enough to span the request)
    timeout_s: float = 600.0  # per request, from sending it to its last byte
    refs: tuple[Ref, ...] = field(default_factory=tuple)


L40S = "L40S report"
GB10 = "GB10 report"


def l40s() -> list[Scenario]:
    return [
        Scenario("decode-1", "decode", 1, refs=(Ref("decode_tok_s_per_stream", 18.3, f"18.3 tok/s ({L40S})"),)),
        Scenario("decode-8", "decode", 8, refs=(Ref("decode_tok_s_total", 47.0, f"~47 tok/s total ({L40S})"),)),
        Scenario(
            "decode-16", "decode", 16, refs=(Ref("decode_tok_s_total", 64.0, f"~64 tok/s total, saturated ({L40S})"),)
        ),
        Scenario(
            "decode-24", "decode", 24, refs=(Ref("decode_tok_s_total", 64.0, f"~64 tok/s total, saturated ({L40S})"),)
        ),
        # 68k in 69.7 s at 32k chunks, the report's measured optimum and current default (85 s at
        # the earlier 16k): 976 tok/s over the whole prompt.
        Scenario(
            "prefill-68k",
            "prefill",
            1,
            68000,
            8,
            runs=2,
            timeout_s=900,
            refs=(
                Ref("ttft_s", 69.7, f"69.7 s ({L40S}, 32k chunks)"),
                Ref("prefill_tok_s", 975.6, f"976 tok/s: 68k in 69.7 s ({L40S}, 32k chunks)"),
            ),
        ),
        # The same prefill while 8 streams decode: "~80 s under 8 concurrent decodes".
        Scenario(
            "prefill-68k-under-8-decodes",
            "prefill",
            1,
            68000,
            8,
            runs=1,
            timeout_s=900,
            background_decodes=8,
            background_tokens=1024,
            refs=(Ref("ttft_s", 80.0, f"~80 s under 8 concurrent decodes ({L40S})"),),
        ),
        Scenario(
            "decode-200k-context",
            "decode",
            1,
            200000,
            256,
            runs=1,
            timeout_s=1800,
            refs=(Ref("decode_tok_s_per_stream", 18.3, f"18.3 tok/s, no loss at 200k ({L40S})"),),
        ),
    ]


def gb10() -> list[Scenario]:
    return [
        Scenario(
            "decode-code",
            "decode",
            1,
            max_tokens=512,
            style="code",
            spec=True,
            refs=(
                Ref("decode_tok_s_per_stream", 29.0, f"~29 tok/s on code ({GB10})"),
                Ref("accept_len", 5.5, f"5.5 with DFlash2 k=7 ({GB10})"),
            ),
        ),
        Scenario(
            "decode-prose",
            "decode",
            1,
            max_tokens=512,
            style="prose",
            spec=True,
            refs=(Ref("decode_tok_s_per_stream", 12.95, f"12.4-13.5 tok/s on prose ({GB10})"),),
        ),
        Scenario(
            "prefill-70k",
            "prefill",
            1,
            70000,
            8,
            runs=2,
            timeout_s=900,
            refs=(Ref("prefill_tok_s", 643.0, f"643 tok/s on 70K ({GB10})"),),
        ),
        Scenario(
            "prefill-198k",
            "prefill",
            1,
            198000,
            8,
            runs=1,
            timeout_s=1800,
            refs=(
                Ref("prefill_tok_s", 632.0, f"632 tok/s on 198K ({GB10})"),
                Ref("ttft_s", 313.0, f"313 s to first token on 198K ({GB10})"),
            ),
        ),
    ]


def quick(platform: str) -> list[Scenario]:
    """About a minute: the same measurements with small prompts and few streams."""
    one = (
        Ref("decode_tok_s_per_stream", 29.0, f"~29 tok/s on code ({GB10})")
        if platform == "gb10"
        else Ref("decode_tok_s_per_stream", 18.3, f"18.3 tok/s ({L40S})")
    )
    style = "code" if platform == "gb10" else "prose"
    return [
        Scenario("decode-1", "decode", 1, max_tokens=128, runs=2, style=style, spec=True, refs=(one,)),
        Scenario("decode-4", "decode", 4, max_tokens=64, runs=1),
        Scenario("prefill-4k", "prefill", 1, 4096, 8, runs=1, timeout_s=300),
    ]


def _ref(d: dict) -> Ref:
    if d.get("metric") not in METRICS:
        raise ValueError(f"ref metric {d.get('metric')!r} is not one of {', '.join(METRICS)}")
    return Ref(d["metric"], float(d["value"]), str(d.get("text", d["value"])))


def from_file(path: str) -> list[Scenario]:
    with open(path) as f:
        items = json.load(f)["scenarios"]
    known = {f.name for f in fields(Scenario)}
    out = []
    for item in items:
        unknown = set(item) - known
        if unknown:
            raise ValueError(f"scenario {item.get('name')!r}: unknown field(s) {', '.join(sorted(unknown))}")
        if item.get("kind") not in ("decode", "prefill"):
            raise ValueError(f"scenario {item.get('name')!r}: kind must be decode or prefill")
        out.append(Scenario(**dict(item, refs=tuple(_ref(r) for r in item.get("refs", ())))))
    return out


def load(suite: str, platform: str) -> list[Scenario]:
    if suite.endswith(".json"):
        try:
            return from_file(suite)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"suite file {suite}: {e}") from None
    builtin = {"l40s": l40s, "gb10": gb10, "quick": lambda: quick(platform)}
    if suite not in builtin:
        raise ValueError(f"unknown suite {suite!r}: use l40s, gb10, quick or a .json file")
    return builtin[suite]()
