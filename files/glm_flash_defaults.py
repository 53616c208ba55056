"""Server-side default for `thinking_token_budget` in vLLM (stdlib only, pure ASGI).

vLLM 0.24.0 takes `thinking_token_budget` per request only. Loaded with
`--middleware glm_flash_defaults.ThinkingBudgetDefault`, this adds
`"thinking_token_budget": N` to a POST of /v1/chat/completions or /v1/completions whose
JSON body does not set one (absent or null). A request that sets its own keeps it.
Anything else (other paths, other methods, bodies that are not a JSON object) passes
through untouched, so vLLM answers it as it would without us.

N comes from the environment (GLM_FLASH_DEFAULT_THINKING_TOKEN_BUDGET, set by the unit);
unset or empty: the middleware does nothing. Installed into the engine environment's
site-packages by the deploy (roles/engines/vllm/engine.py).

vLLM adds user middlewares after its API-key check, so this one runs before it: a request whose
`Authorization` is not one of the server's keys (vLLM's `--api-key`, which glm-flash-launch adds
to the server's argv in-process, or VLLM_API_KEY) is handed on without a byte of its body read,
and vLLM answers it 401. Only a client with the key gets its body buffered, and only up to
MAX_BODY: larger bodies pass through unparsed.
"""

from __future__ import annotations

import hmac
import json
import os
import sys

ENV = "GLM_FLASH_DEFAULT_THINKING_TOKEN_BUDGET"
PATHS = ("/v1/chat/completions", "/v1/completions")
FIELD = "thinking_token_budget"
# The 204,800-token context as JSON text, generously: 40 bytes a token covers escaped non-ASCII
# (6 bytes a character) several times over. A larger body (images as base64) passes unparsed.
MAX_BODY = 8 << 20


def server_keys(argv: list[str], environ) -> list[bytes] | None:
    """The keys vLLM itself will require (`--api-key K` / `--api-key=K` in argv, else VLLM_API_KEY);
    None when the server takes requests without one."""
    keys = []
    for i, arg in enumerate(argv):
        if arg == "--api-key" and i + 1 < len(argv):
            keys.append(argv[i + 1])
        elif arg.startswith("--api-key="):
            keys.append(arg.partition("=")[2])
    if not keys and environ.get("VLLM_API_KEY"):
        keys.append(environ["VLLM_API_KEY"])
    return [k.encode() for k in keys if k] or None


def authorized(scope, keys: list[bytes]) -> bool:
    """The request carries `Authorization: Bearer <one of keys>` (compared in constant time)."""
    given = b""
    for name, value in scope.get("headers", []):
        if name.lower() == b"authorization":
            given = value
            break
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, b"Bearer " + key)
    return ok


def _budget_from_env():
    raw = os.environ.get(ENV, "").strip()
    if not raw:
        return None
    value = int(raw)
    if value < 0:
        raise ValueError(f"{ENV}={raw!r}: must be a whole number >= 0")
    return value


def with_default(body: bytes, budget: int) -> bytes | None:
    """The body with the default added, or None when it stays as it is."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get(FIELD) is not None:
        return None
    data[FIELD] = budget
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


class ThinkingBudgetDefault:
    def __init__(self, app, budget: int | None = None, keys: list[bytes] | None = None):
        self.app = app
        self.budget = _budget_from_env() if budget is None else budget
        self.keys = server_keys(sys.argv[1:], os.environ) if keys is None else keys

    async def __call__(self, scope, receive, send):
        if (
            self.budget is None
            or scope.get("type") != "http"
            or scope.get("method") != "POST"
            or scope.get("path", "").removeprefix(scope.get("root_path", "")).rstrip("/") not in PATHS
            or (self.keys and not authorized(scope, self.keys))  # vLLM refuses it, unread
        ):
            return await self.app(scope, receive, send)
        chunks, size, tail = [], 0, None
        while True:
            message = await receive()
            if message["type"] != "http.request":
                tail = message  # the client went away: hand that on as is
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if not message.get("more_body", False) or size > MAX_BODY:
                break
        body = b"".join(chunks)
        new = with_default(body, self.budget) if tail is None and size <= MAX_BODY else None
        if new is not None:
            body = new
            headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            scope = dict(scope, headers=headers)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                if tail is not None:
                    return tail
                more = size > MAX_BODY
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        return await self.app(scope, replay, send)
