"""Server-side default for `thinking_token_budget` in vLLM (stdlib only, pure ASGI).

vLLM 0.24.0 takes `thinking_token_budget` per request only. Loaded with
`--middleware glm_flash_defaults.ThinkingBudgetDefault`, this adds
`"thinking_token_budget": N` to a POST of /v1/chat/completions or /v1/completions whose
JSON body does not set one (absent or null). A request that sets its own keeps it.
Anything else (other paths, other methods, bodies that are not a JSON object) passes
through untouched, so vLLM answers it as it would without us.

N comes from the environment (GLM_FLASH_DEFAULT_THINKING_TOKEN_BUDGET, set by the unit);
unset or empty: the middleware does nothing. Installed into the engine environment's
site-packages by the deploy (roles/engine_vllm.py).
"""

from __future__ import annotations

import json
import os

ENV = "GLM_FLASH_DEFAULT_THINKING_TOKEN_BUDGET"
PATHS = ("/v1/chat/completions", "/v1/completions")
FIELD = "thinking_token_budget"
MAX_BODY = 64 << 20  # larger bodies pass through unparsed


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
    def __init__(self, app, budget: int | None = None):
        self.app = app
        self.budget = _budget_from_env() if budget is None else budget

    async def __call__(self, scope, receive, send):
        if (
            self.budget is None
            or scope.get("type") != "http"
            or scope.get("method") != "POST"
            or scope.get("path", "").removeprefix(scope.get("root_path", "")).rstrip("/") not in PATHS
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
