"""An OpenAI-compatible server on 127.0.0.1 whose speed the test sets.

Streams `/v1/chat/completions` and `/v1/completions` as SSE, chunked like vLLM and SGLang
(or, `chunked=False`, until the connection closes):
a role-only first chunk (chat), the first token after `ttft_s + prompt_tokens / prefill_tok_s`,
then `chunk` tokens per event at `tok_s` tokens per second, each request on its own
schedule (so concurrent streams each get the set rate). Usage is sent at the end when the
request asks for it (`stream_options.include_usage`) unless `usage=False`. Prompt tokens
are counted from the characters (one per `chars_per_token`, plus a template overhead), so
the bench must calibrate to hit a length. With `api_key` set, other keys get 401. Every
`fail_every`-th generation breaks off mid-stream. `/metrics` publishes vLLM's spec-decode
counters when `accept_len` is set (drafts of `draft_k` tokens, `accept_len - 1` accepted).
`/health` answers 200 like the engines'. The server stops by itself after `lifetime_s`;
`host` and `port` choose where it listens (a fleet sandbox's loopback address).
With `answer` set (a function of the user's text), a non-streaming chat request is answered
with what it returns, as `message.content` (a `(content, reasoning)` pair also fills
`reasoning_content`, as vLLM's and SGLang's reasoning parsers do): the eval's stand-in.
"""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TEMPLATE_TOKENS = 9   # what a chat template adds around the user's text


class _Server(ThreadingHTTPServer):
    # A backlog like uvicorn's: with socketserver's 5, the 6th simultaneous stream waits for a SYN retry.
    request_queue_size = 128
    daemon_threads = True


class FakeOpenAI:
    def __init__(self, tok_s: float = 200.0, ttft_s: float = 0.05, prefill_tok_s: float | None = None,
                 chunk: int = 1, usage: bool = True, api_key: str | None = None, fail_every: int = 0,
                 accept_len: float | None = None, draft_k: int = 7, chars_per_token: float = 3.5,
                 model: str = "glm-5.3-flash", chunked: bool = True, lifetime_s: float = 300.0,
                 host: str = "127.0.0.1", port: int = 0, answer=None, kv_tokens: int | None = None):
        self.tok_s, self.ttft_s, self.prefill_tok_s, self.chunk = tok_s, ttft_s, prefill_tok_s, chunk
        self.usage, self.api_key, self.fail_every, self.model = usage, api_key, fail_every, model
        self.accept_len, self.draft_k, self.chars_per_token = accept_len, draft_k, chars_per_token
        self.chunked = chunked
        self.answer = answer
        self.kv_tokens = kv_tokens  # /get_server_info's max_total_num_tokens, as SGLang answers it
        self.active = 0  # streams in flight now, and the most seen at once
        self.peak = 0
        self.lock = threading.Lock()
        self.generations = 0
        self.failed = 0
        self.prompts: list[str] = []
        self.bodies: list[dict] = []
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        self.httpd = _Server((host, port), self._handler())
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True

    def __enter__(self):
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self):
        self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()

    def prompt_tokens(self, text: str, chat: bool) -> int:
        return math.ceil(len(text) / self.chars_per_token) + (TEMPLATE_TOKENS if chat else 1)

    def metrics_text(self) -> str:
        c = self.counters
        return ("# TYPE vllm:spec_decode_num_drafts counter\n"
                f'vllm:spec_decode_num_drafts_total{{model_name="{self.model}"}} {float(c["drafts"])}\n'
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="{self.model}"}} {float(c["draft_tokens"])}\n'
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="{self.model}"}} {float(c["accepted"])}\n')

    def _count_spec(self, tokens: int):
        # Each step emits the accepted drafts plus one token of the target model.
        steps = math.ceil(tokens / self.accept_len)
        self.counters["drafts"] += steps
        self.counters["draft_tokens"] += steps * self.draft_k
        self.counters["accepted"] += round(steps * (self.accept_len - 1))

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _reply(self, code: int, body: bytes, ctype: str = "application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _authorized(self) -> bool:
                if fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    self._reply(401, json.dumps({"error": {"message": "Invalid API key", "code": 401}}).encode())
                    return False
                return True

            def do_GET(self):
                if self.path == "/health":  # what SGLang and vLLM answer, without a key
                    self._reply(200, b"")
                elif self.path == "/metrics" and fake.accept_len:
                    with fake.lock:
                        self._reply(200, fake.metrics_text().encode(), "text/plain; version=0.0.4")
                elif self.path == "/get_server_info" and fake.kv_tokens and self._authorized():
                    self._reply(200, json.dumps({"max_total_num_tokens": fake.kv_tokens}).encode())
                elif self.path == "/v1/models" and self._authorized():
                    self._reply(200, json.dumps({"data": [{"id": fake.model, "object": "model"}]}).encode())
                elif self.path != "/v1/models":
                    self._reply(404, b'{"detail":"Not Found"}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not self._authorized():
                    return
                chat = self.path == "/v1/chat/completions"
                if not chat and self.path != "/v1/completions":
                    return self._reply(404, b'{"detail":"Not Found"}')
                text = body["messages"][-1]["content"] if chat else body["prompt"]
                prompt_tokens = fake.prompt_tokens(text, chat)
                out = int(body.get("max_tokens") or 16)
                with fake.lock:
                    fake.prompts.append(text)
                    fake.bodies.append(body)
                    fake.generations += 1
                    breaks = fake.fail_every and fake.generations % fake.fail_every == 0
                if not body.get("stream") and chat and fake.answer:
                    return self._answer(text, prompt_tokens)
                if not body.get("stream"):
                    return self._whole(chat, prompt_tokens, out)
                with fake.lock:
                    fake.active += 1
                    fake.peak = max(fake.peak, fake.active)
                try:
                    self._stream(chat, body, prompt_tokens, out, breaks)
                finally:
                    with fake.lock:
                        fake.active -= 1

            def _whole(self, chat, prompt_tokens, out):
                time.sleep(fake.ttft_s)
                choice = {"index": 0, "finish_reason": "length"}
                choice.update({"message": {"role": "assistant", "content": "x " * out}} if chat else {"text": "x " * out})
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": out, "total_tokens": prompt_tokens + out}
                self._reply(200, json.dumps({"id": "cmpl-1", "model": fake.model, "choices": [choice], "usage": usage}).encode())

            def _answer(self, text, prompt_tokens):
                got = fake.answer(text)
                content, reasoning = got if isinstance(got, tuple) else (got, None)
                message = {"role": "assistant", "content": content}
                if reasoning is not None:
                    message["reasoning_content"] = reasoning
                choice = {"index": 0, "finish_reason": "stop", "message": message}
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(content or "") // 4,
                         "total_tokens": prompt_tokens + len(content or "") // 4}
                self._reply(200, json.dumps({"id": "chatcmpl-1", "model": fake.model, "choices": [choice],
                                             "usage": usage}).encode())

            def _event(self, obj) -> None:
                data = obj if isinstance(obj, str) else json.dumps(obj)
                event = f"data: {data}\n\n".encode()
                # Chunked, as uvicorn sends a streaming response (vLLM, SGLang); else until close.
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event) if fake.chunked else event)
                self.wfile.flush()

            def _end(self) -> None:
                if fake.chunked:
                    self.wfile.write(b"0\r\n\r\n")

            def _piece(self, chat, text, finish=None):
                choice = {"index": 0, "finish_reason": finish}
                choice.update({"delta": {"content": text}} if chat else {"text": text})
                return {"id": "cmpl-1", "object": "chat.completion.chunk" if chat else "text_completion",
                        "model": fake.model, "choices": [choice]}

            def _stream(self, chat, body, prompt_tokens, out, breaks):
                start = time.monotonic()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                if fake.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                if chat:
                    self._event({"id": "cmpl-1", "model": fake.model,
                                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                first = start + fake.ttft_s + (prompt_tokens / fake.prefill_tok_s if fake.prefill_tok_s else 0.0)
                sent = 0
                while sent < out:
                    n = 1 if sent == 0 else min(fake.chunk, out - sent)
                    # Absolute schedule: the rate does not drift with the time spent writing.
                    due = first + (sent + n - 1) / fake.tok_s
                    time.sleep(max(0.0, due - time.monotonic()))
                    if breaks and sent >= out // 2:
                        with fake.lock:
                            fake.failed += 1
                        self._event({"error": {"message": "engine died", "code": 500}})
                        self._end()
                        return
                    self._event(self._piece(chat, " tok" * n, "length" if sent + n >= out else None))
                    sent += n
                if fake.accept_len:
                    with fake.lock:
                        fake._count_spec(out)
                wants = (body.get("stream_options") or {}).get("include_usage")
                if fake.usage and wants:
                    self._event({"id": "cmpl-1", "model": fake.model, "choices": [], "usage": {
                        "prompt_tokens": prompt_tokens, "completion_tokens": out, "total_tokens": prompt_tokens + out}})
                self._event("[DONE]")
                self._end()

        return Handler
