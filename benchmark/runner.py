"""Run a suite's scenarios: calibrate, warm up, run, and turn samples into medians.

Each run of a scenario starts its streams together (a barrier) and waits for all of them.
Per-stream decode rate: tokens after the first / time from first to last token. Total:
all streams' tokens after their first / the window from the earliest first token to the
latest last token, so a server that serializes streams shows no gain from more of them.
"""

from __future__ import annotations

import statistics
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

from benchmark import metrics, prompts
from benchmark.client import BenchError, Endpoint, Sample, stream, whole
from benchmark.suites import Scenario

PROBE_CHARS = (400, 4000)


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def calibrate(ep: Endpoint, chat: bool) -> prompts.Calibration:
    seen = []
    for chars in PROBE_CHARS:
        text = prompts.nonce() + prompts.filler(chars, "prose")
        reply = whole(ep, text, 1, 120, chat=chat)
        try:
            seen.append((len(text), int(reply["usage"]["prompt_tokens"])))
        except (KeyError, TypeError, ValueError):
            raise BenchError(
                f"{ep.url} sends no usage.prompt_tokens, so prompt lengths cannot be set in its tokens"
            ) from None
    try:
        return prompts.Calibration.fit(*seen)
    except ValueError as e:
        raise BenchError(f"{ep.url}: {e}") from None


def accepts_ignore_eos(ep: Endpoint) -> bool:
    s = stream(ep, prompts.nonce() + "Say hi.", 4, 120, ignore_eos=True)
    if s.ok:
        return True
    if s.error.startswith("HTTP 4"):
        log(f"the server refused ignore_eos ({s.error[:80]}); decode runs stop at the model's own end")
        return False
    raise BenchError(f"{ep.url}: a 4-token streaming request failed: {s.error}")


class Runner:
    def __init__(self, ep: Endpoint, scenarios: list[Scenario]):
        self.ep, self.scenarios = ep, scenarios
        self.chat_cal = self.text_cal = None
        self.ignore_eos = True

    def prepare(self) -> dict:
        log("calibrating prompt length against the server's token counts")
        self.chat_cal = calibrate(self.ep, chat=True)
        self.text_cal = calibrate(self.ep, chat=False)
        self.ignore_eos = accepts_ignore_eos(self.ep)
        log(f"{self.chat_cal.per_char:.3f} tokens per character; ignore_eos {'on' if self.ignore_eos else 'off'}")
        kv, where = metrics.kv_pool(self.ep.url, self.ep.headers())
        log(f"KV pool: {kv} tokens ({where})" if kv else f"KV pool: unknown ({where})")
        return {
            "chat": asdict(self.chat_cal),
            "completions": asdict(self.text_cal),
            "ignore_eos": self.ignore_eos,
            "kv_pool_tokens": kv,
            "kv_pool_source": where,
        }

    def _one(self, sc: Scenario, warm: bool = False) -> Sample:
        if sc.kind == "prefill":
            return stream(
                self.ep,
                prompts.prefill_prompt(sc.style, sc.prompt_tokens, self.text_cal),
                sc.max_tokens,
                sc.timeout_s,
                chat=False,
                ignore_eos=self.ignore_eos,
            )
        # A decode warm-up needs no long context: it is there for the decode path, not prefill.
        tokens = 0 if warm else sc.prompt_tokens
        return stream(
            self.ep,
            prompts.decode_prompt(sc.style, tokens, self.chat_cal),
            sc.max_tokens,
            sc.timeout_s,
            ignore_eos=self.ignore_eos,
        )

    def _run(self, sc: Scenario) -> list[Sample]:
        if sc.background_decodes:
            return self._under_load(sc)
        barrier = threading.Barrier(sc.streams)

        def go(_):
            barrier.wait()
            return self._one(sc)

        with ThreadPoolExecutor(max_workers=sc.streams) as pool:
            return list(pool.map(go, range(sc.streams)))

    def _under_load(self, sc: Scenario) -> list[Sample]:
        """The scenario's request while `background_decodes` decode streams run: they start first, the
        measured request once each has its first token (or failed); their samples are not reported."""
        started = threading.Semaphore(0)
        n = sc.background_decodes

        def decode(_):
            prompt = prompts.decode_prompt("prose", 0, self.chat_cal)
            s = stream(
                self.ep,
                prompt,
                sc.background_tokens,
                sc.timeout_s,
                ignore_eos=self.ignore_eos,
                on_first=started.release,
            )
            if s.t_first is None:
                started.release()
            return s

        with ThreadPoolExecutor(max_workers=n) as pool:
            background = [pool.submit(decode, i) for i in range(n)]
            for _ in range(n):
                started.acquire(timeout=sc.timeout_s)
            measured = self._one(sc)
            late = sum(1 for f in background if f.done())
            if late:
                log(f"{sc.name}: {late} of {n} background decodes ended before the measured request did")
            for f in background:
                f.result()
        return [measured]

    def scenario(self, sc: Scenario, index: int, count: int) -> dict:
        tag = f"[{index}/{count}] {sc.name}"
        log(
            f"{tag}: {sc.streams} stream(s), prompt ~{sc.prompt_tokens} tokens, {sc.max_tokens} out, "
            f"1 warm-up + {sc.runs} run(s), up to {sc.timeout_s:.0f} s per request"
        )
        w = self._one(sc, warm=True)
        if not w.ok:
            log(f"{tag}: warm-up failed ({w.error}); measuring anyway")
        samples: list[Sample] = []
        totals, accepts, skipped = [], [], ""
        for run in range(1, sc.runs + 1):
            before = metrics.scrape(self.ep.url, self.ep.headers())[0] if sc.spec else None
            got = self._run(sc)
            if sc.spec:
                after, why = metrics.scrape(self.ep.url, self.ep.headers())
                value, reason = metrics.acceptance(before, after)
                accepts.append(value)
                skipped = skipped or reason or why
            samples += got
            ok = [s for s in got if s.ok]
            total = window_rate(ok)
            totals.append(total)
            rates = [s.decode_tok_s for s in ok if s.decode_tok_s] if sc.kind == "decode" else []
            ttfts = [s.ttft_s for s in ok]
            log(
                f"{tag}: run {run}/{sc.runs}: {len(ok)} ok, {len(got) - len(ok)} failed"
                + (f", {statistics.median(rates):.1f} tok/s per stream" if rates else "")
                + (f", {total:.1f} total" if total and sc.streams > 1 else "")
                + (f", first token after {statistics.median(ttfts):.2f} s" if ttfts else "")
            )
        return summarize(sc, samples, totals, accepts, skipped, self.chat_cal if sc.kind == "decode" else self.text_cal)


def window_rate(ok: list[Sample]) -> float | None:
    timed = [s for s in ok if s.t_first is not None and s.completion_tokens >= 2]
    if not timed:
        return None
    window = max(s.t_last for s in timed) - min(s.t_first for s in timed)
    return sum(s.completion_tokens - 1 for s in timed) / window if window > 0 else None


def summarize(
    sc: Scenario, samples: list[Sample], totals: list, accepts: list, skipped: str, cal: prompts.Calibration | None
) -> dict:
    ok = [s for s in samples if s.ok]
    prompt_tokens = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    estimated = not prompt_tokens and bool(ok)
    if estimated:
        # No usage in the stream: fall back to the calibrated length.
        prompt_tokens = [cal.estimate(cal.chars_for(sc.prompt_tokens))] if cal else []
    result = {
        "name": sc.name,
        "kind": sc.kind,
        "streams": sc.streams,
        "prompt_tokens": stats(prompt_tokens),
        "output_tokens": stats([s.completion_tokens for s in ok]),
        "ttft_s": stats([s.ttft_s for s in ok]),
        "decode_tok_s_per_stream": stats([s.decode_tok_s for s in ok]),
        "decode_tok_s_total": stats(totals),
        "prefill_tok_s": stats(
            [(s.prompt_tokens or prompt_tokens[0]) / s.ttft_s for s in ok if s.ttft_s] if prompt_tokens else []
        ),
        "requests_ok": len(ok),
        "requests_failed": len(samples) - len(ok),
        "errors": sorted({s.error for s in samples if not s.ok})[:5],
        "usage_in_stream": all(s.usage_seen for s in ok) if ok else None,
        "prompt_tokens_estimated": estimated,
    }
    if sc.spec:
        result["accept_len"] = stats(accepts)
        if result["accept_len"] is None:
            result["accept_len_skipped"] = skipped or metrics.ABSENT
    return result
