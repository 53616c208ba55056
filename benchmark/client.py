"""One streaming request to an OpenAI-compatible server, timed per token event.

Threads with `requests` rather than an event loop: at most a few dozen streams, and
`requests` is already the repo's HTTP client. A request that fails in any way (HTTP
error, an error event, a stream cut short, a timeout) comes back as a `Sample` with
`error` set; it never raises.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import requests


class BenchError(Exception):
    """Bad input or an unusable server: one line for the person, exit non-zero."""


@dataclass
class Sample:
    ok: bool = False
    error: str = ""
    ttft_s: float | None = None  # request sent -> first generated token
    decode_s: float | None = None  # first token -> last token
    completion_tokens: int = 0
    prompt_tokens: int | None = None  # from usage; None when the server sent none
    usage_seen: bool = False
    t_first: float | None = None  # monotonic clock, to line up concurrent streams
    t_last: float | None = None

    @property
    def decode_tok_s(self) -> float | None:
        # The first token belongs to prefill; the rate is over the tokens after it.
        if not self.ok or not self.decode_s or self.completion_tokens < 2:
            return None
        return (self.completion_tokens - 1) / self.decode_s


class Endpoint:
    def __init__(self, url: str, api_key: str | None, model: str):
        self.url, self.api_key, self.model = url.rstrip("/"), api_key, model

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def body(self, prompt: str, max_tokens: int, chat: bool, stream: bool, ignore_eos: bool) -> dict:
        b: dict = {"model": self.model, "max_tokens": max_tokens, "temperature": 0, "stream": stream}
        if chat:
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if stream:
            b["stream_options"] = {"include_usage": True}
        if ignore_eos:
            b["ignore_eos"] = True  # vLLM and SGLang take it; it makes every run emit max_tokens
        return b


def _path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


def _text_of(choice: dict) -> str:
    delta = choice.get("delta") or {}
    # Reasoning models stream thinking in reasoning_content (vLLM, SGLang); it is decode all the same.
    return delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning") or choice.get("text") or ""


def _lines(r: requests.Response):
    """SSE lines as they arrive. requests' iter_lines waits for 512 bytes (or the whole body
    without chunked encoding) before it yields, which would shift every token's time."""
    buf = b""
    while True:
        data = r.raw.read1(65536)
        if not data:
            break
        *lines, buf = (buf + data).split(b"\n")
        yield from (line.rstrip(b"\r") for line in lines)
    if buf:
        yield buf


def stream(
    ep: Endpoint,
    prompt: str,
    max_tokens: int,
    timeout_s: float,
    chat: bool = True,
    ignore_eos: bool = True,
    on_first=None,
) -> Sample:
    s = Sample()
    chunks = 0
    start = time.monotonic()
    deadline = start + timeout_s
    try:
        with requests.post(
            ep.url + _path(chat),
            headers=ep.headers(),
            stream=True,
            json=ep.body(prompt, max_tokens, chat, True, ignore_eos),
            timeout=(10, timeout_s),
        ) as r:
            if r.status_code != 200:
                s.error = f"HTTP {r.status_code}: {r.text[:200]}"
                return s
            done = False
            for line in _lines(r):
                if time.monotonic() > deadline:
                    s.error = f"timed out after {timeout_s:.0f} s"
                    return s
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    s.error = f"error event: {str(event['error'])[:200]}"
                    return s
                if event.get("usage"):
                    s.usage_seen = True
                    s.prompt_tokens = event["usage"].get("prompt_tokens")
                    s.completion_tokens = event["usage"].get("completion_tokens") or 0
                for choice in event.get("choices") or ():
                    if _text_of(choice):
                        now = time.monotonic()
                        if s.t_first is None:
                            s.t_first = now
                            if on_first:
                                on_first()
                        s.t_last = now
                        chunks += 1
            if not done:
                s.error = "stream ended before [DONE]"
                return s
    except requests.Timeout:
        s.error = f"timed out after {timeout_s:.0f} s"
        return s
    except (requests.RequestException, ValueError, KeyError, TypeError, AttributeError) as e:
        s.error = f"{type(e).__name__}: {str(e)[:200]}"
        return s
    if s.t_first is None:
        s.error = "no token in the stream"
        return s
    if not s.usage_seen:
        # Without usage one event is taken as one token (true unless the server batches tokens).
        s.completion_tokens = chunks
    s.ttft_s = s.t_first - start
    s.decode_s = s.t_last - s.t_first
    s.ok = True
    return s


def explain(e: requests.RequestException, url: str) -> str:
    if isinstance(e, requests.ConnectionError):
        reason = str(e)
        for known in (
            "Connection refused",
            "Name or service not known",
            "No route to host",
            "Temporary failure in name resolution",
            "timed out",
        ):
            if known in reason:
                return f"cannot reach {url}: {known.lower()}"
        return f"cannot reach {url}: connection failed"
    if isinstance(e, requests.Timeout):
        return f"cannot reach {url}: no answer in time"
    return f"cannot reach {url}: {type(e).__name__}"


def whole(ep: Endpoint, prompt: str, max_tokens: int, timeout_s: float, chat: bool = True) -> dict:
    """A non-streaming request whose usage the calibration reads; raises BenchError."""
    try:
        r = requests.post(
            ep.url + _path(chat),
            headers=ep.headers(),
            timeout=(10, timeout_s),
            json=ep.body(prompt, max_tokens, chat, False, False),
        )
    except requests.RequestException as e:
        raise BenchError(explain(e, ep.url)) from None
    check_status(r, ep.url)
    try:
        return r.json()
    except ValueError:
        raise BenchError(f"{ep.url}{_path(chat)} answered with something that is not JSON") from None


def check_status(r: requests.Response, url: str) -> None:
    if r.status_code == 401 or r.status_code == 403:
        raise BenchError(
            f"{url} refused the API key (HTTP {r.status_code}): set GLM_FLASH_API_KEY "
            "to the key the node was deployed with"
        )
    if r.status_code == 404:
        raise BenchError(f"{url} has no {r.request.path_url} (HTTP 404): is it an OpenAI-compatible server?")
    if r.status_code != 200:
        raise BenchError(f"{url} answered HTTP {r.status_code} to {r.request.path_url}: {r.text[:120]!r}")


def served_model(url: str, api_key: str | None) -> str | None:
    """The first model /v1/models lists (None when it lists none); also the first check of
    address and key."""
    ep = Endpoint(url, api_key, "")
    try:
        r = requests.get(ep.url + "/v1/models", headers=ep.headers(), timeout=(10, 30))
    except requests.RequestException as e:
        raise BenchError(explain(e, ep.url)) from None
    check_status(r, ep.url)
    try:
        return r.json()["data"][0]["id"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
