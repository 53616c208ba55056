"""Synthetic prompts measured in the server's own tokens, so no tokenizer is downloaded.

The filler is pseudo-random English-like prose (or Python-like code) from a fixed seed.
`Calibration` fits tokens = overhead + chars * per_char from two probe requests whose
`usage.prompt_tokens` the server reports, then sizes text to a wanted token count.
Every prompt starts with a fresh nonce, so the server's prefix cache cannot reuse an
earlier request's work.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

WORDS = (
    "the river market north engine quiet careful window stone village morning letter garden "
    "winter summer people harbor signal paper silver bridge mountain teacher story answer "
    "measure forest station journey kitchen lantern orchard meadow weather history number "
    "season captain doctor farmer island machine travel bright simple heavy narrow gentle "
    "ancient patient sudden steady follow gather wonder listen remember carry arrive"
).split()

CODE_LINES = (
    "def {a}_{b}(items, limit={n}):",
    "    result = [x for x in items if x.{a} < limit]",
    "    return sorted(result, key=lambda x: x.{b})",
    "class {A}{B}:",
    "    def __init__(self, {a}, {b}={n}):",
    "        self.{a} = {a}",
    "        self.cache = {{}}",
    "for index, {a} in enumerate({b}_list):",
    "    if {a} is None:",
    "        continue",
    "    total += {a}.{b} * {n}",
)

ASK = {
    "prose": "Write a long, detailed story about a lighthouse keeper and a storm. Keep writing.",
    "code": (
        "Write a complete Python module implementing an LRU cache with type hints, docstrings "
        "and a full pytest test suite. Output only code."
    ),
}
SUMMARY_ASK = "\n\nIn one sentence, what is the text above about?"


def filler(chars: int, style: str, seed: int = 7) -> str:
    rng = random.Random(seed)
    parts: list[str] = []
    size = 0
    while size < chars:
        if style == "code":
            a, b = rng.choice(WORDS), rng.choice(WORDS)
            line = rng.choice(CODE_LINES).format(a=a, b=b, A=a.title(), B=b.title(), n=rng.randint(1, 999))
            piece = line + "\n"
        else:
            sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16)))
            piece = sentence.capitalize() + ". "
        parts.append(piece)
        size += len(piece)
    return "".join(parts)[:chars]


def nonce() -> str:
    return f"[request {uuid.uuid4().hex}]\n"


@dataclass
class Calibration:
    overhead: float  # tokens the server adds (template, nonce) beyond the text
    per_char: float  # tokens per character of filler

    def chars_for(self, tokens: int) -> int:
        return max(0, round((tokens - self.overhead) / self.per_char))

    def estimate(self, chars: int) -> int:
        return round(self.overhead + chars * self.per_char)

    @classmethod
    def fit(cls, small: tuple[int, int], large: tuple[int, int]) -> Calibration:
        """From two (chars, prompt_tokens) probes."""
        (c1, t1), (c2, t2) = small, large
        if c2 <= c1 or t2 <= t1:
            raise ValueError(f"probes gave no usable token counts ({t1} for {c1} chars, {t2} for {c2} chars)")
        per_char = (t2 - t1) / (c2 - c1)
        return cls(overhead=t1 - c1 * per_char, per_char=per_char)


def decode_prompt(style: str, tokens: int, cal: Calibration | None) -> str:
    """The ask, padded with context when the scenario wants a long prompt (decode at long context)."""
    ask = ASK.get(style, ASK["prose"])
    if cal is None or tokens <= cal.estimate(len(nonce() + ask)) + 16:
        return nonce() + ask
    context = filler(cal.chars_for(tokens) - len(nonce() + ask) - 2, style)
    return nonce() + context + "\n\n" + ask


def prefill_prompt(style: str, tokens: int, cal: Calibration) -> str:
    body = filler(max(0, cal.chars_for(tokens) - len(nonce()) - len(SUMMARY_ASK)), style)
    return nonce() + body + SUMMARY_ASK
