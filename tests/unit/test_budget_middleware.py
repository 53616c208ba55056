"""files/glm_flash_defaults.py before vLLM's key check (#36 item 6): a request without the server's
key is handed on unread (vLLM answers it 401), and only a client with the key has its body buffered,
bounded. Pure ASGI with a stand-in app; tests/gb10/test_vllm_args.py runs it inside vLLM 0.24.0's
own middleware stack."""

from __future__ import annotations

import asyncio
import json
import sys

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "files"))
import glm_flash_defaults as mw  # noqa: E402

KEY = b"sk-test-0123456789"
PATH = "/v1/chat/completions"


class Client:
    """A request's body as ASGI messages, counting what was read of it."""

    def __init__(self, body: bytes, piece: int = 1 << 20):
        self.pieces = [body[i : i + piece] for i in range(0, len(body), piece)] or [b""]
        self.read = 0

    async def receive(self):
        i = self.read
        self.read += 1
        if i >= len(self.pieces):
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": self.pieces[i], "more_body": i + 1 < len(self.pieces)}


def scope(auth: bytes | None, path: str = PATH) -> dict:
    headers = [(b"content-type", b"application/json")]
    if auth is not None:
        headers.append((b"authorization", auth))
    return {"type": "http", "method": "POST", "path": path, "root_path": "", "headers": headers}


def run(app, sc, client):
    async def send(_message):
        pass

    asyncio.run(app(sc, client.receive, send))


class Refuser:
    """vLLM's key check in small: no key, 401, without reading the body."""

    def __init__(self):
        self.calls = []

    async def __call__(self, sc, receive, send):
        self.calls.append(sc)


class Reader:
    def __init__(self):
        self.body = b""

    async def __call__(self, sc, receive, send):
        while True:
            m = await receive()
            self.body += m.get("body", b"")
            if not m.get("more_body"):
                return


def test_a_request_without_the_key_is_passed_on_unread():
    big = b'{"a":[' + b"0.1," * (16 << 20) + b"0.1]}"  # 64 MiB of JSON, as the attack sends
    for auth in (None, b"Bearer wrong", b"Bearer " + KEY[:-1] + b"X", KEY):
        inner = Refuser()
        client = Client(big)
        run(mw.ThinkingBudgetDefault(inner, budget=1536, keys=[KEY]), scope(auth), client)
        assert client.read == 0, f"{auth!r}: the middleware read the body before the key check"
        assert len(inner.calls) == 1


def test_with_the_key_the_default_is_added():
    inner = Reader()
    body = json.dumps({"model": "m", "messages": []}).encode()
    run(mw.ThinkingBudgetDefault(inner, budget=1536, keys=[KEY]), scope(b"Bearer " + KEY), Client(body))
    assert json.loads(inner.body)["thinking_token_budget"] == 1536


def test_a_keyed_body_is_buffered_only_up_to_the_bound():
    inner = Reader()
    big = b'{"a":"' + b"x" * (mw.MAX_BODY + 3 * (1 << 20)) + b'"}'
    client = Client(big)
    app = mw.ThinkingBudgetDefault(inner, budget=1536, keys=[KEY])
    run(app, scope(b"Bearer " + KEY), client)
    assert inner.body == big  # passed on whole, unparsed (no default added past the bound)
    assert mw.MAX_BODY <= 8 << 20  # the 204,800-token context as JSON, not 64 MiB


@pytest.mark.parametrize(
    "argv,env,want",
    [
        (["--model", "m", "--api-key", "k1"], {}, [b"k1"]),
        (["--api-key=k2", "--port", "1"], {"VLLM_API_KEY": "other"}, [b"k2"]),
        (["--model", "m"], {"VLLM_API_KEY": "k3"}, [b"k3"]),
        (["--model", "m"], {}, None),
    ],
)
def test_the_servers_keys_are_vllms_own(argv, env, want):
    assert mw.server_keys(argv, env) == want


def test_without_a_key_every_request_gets_the_default():
    inner = Reader()
    body = json.dumps({"model": "m"}).encode()
    run(mw.ThinkingBudgetDefault(inner, budget=7, keys=None), scope(None), Client(body))
    assert json.loads(inner.body)["thinking_token_budget"] == 7
