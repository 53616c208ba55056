"""The hub token of `make model-lock` / the first deploy's lock (control/model_lock.resolve) goes to
the hub's own origin only: a redirect to another origin is followed without it (#36 item 8, L6).
Two real HTTP servers on loopback, on different ports (two origins)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from control import model_lock

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_redirect_canary_0123456789"


class Recorder(ThreadingHTTPServer):
    def __init__(self, redirect_to=None):
        self.seen: list[tuple[str, str | None]] = []
        self.redirect_to = redirect_to
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.seen.append((self.path, self.headers.get("Authorization")))
                if outer.redirect_to and not self.path.startswith("/moved"):
                    self.send_response(302)
                    self.send_header("Location", outer.redirect_to() + "/moved" + self.path)
                    self.end_headers()
                    return
                body = json.dumps({"sha": COMMIT}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def servers():
    made = []

    def make(redirect_to=None):
        made.append(Recorder(redirect_to))
        return made[-1]

    yield make
    for s in made:
        s.shutdown()
        s.server_close()


def test_a_redirect_to_another_origin_does_not_carry_the_token(servers):
    other = servers()
    hub = servers(redirect_to=lambda: other.url)
    assert model_lock.resolve(hub.url, "zai-org/GLM-5.3-Flash", "main", TOKEN) == COMMIT
    assert hub.seen[0][1] == f"Bearer {TOKEN}"
    assert other.seen and all(auth is None for _, auth in other.seen), other.seen


def test_a_redirect_within_the_hub_keeps_it(servers):
    hub = servers()
    hub.redirect_to = lambda: hub.url
    assert model_lock.resolve(hub.url, "zai-org/GLM-5.3-Flash", "main", TOKEN) == COMMIT
    assert [auth for _, auth in hub.seen] == [f"Bearer {TOKEN}", f"Bearer {TOKEN}"]
