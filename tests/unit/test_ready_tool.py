"""files/glm-flash-ready against a local OpenAI-shaped server: ready only on a real answer,
asked where the engine listens.

The server is a stand-in for the engine (no GPU here); the tool is the one the unit runs
as ExecStartPost, run as a subprocess with the system's python3 as on a host.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "files" / "glm-flash-ready"


def serve(address: str, message):
    """An engine stand-in on `address`, port 0 (the kernel's choice, read back from the socket)."""

    class Engine(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = json.dumps({"choices": [{"message": message}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((address, 0), Engine)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def ready(host: str, port: int, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), "--host", host, "--port", str(port), "--model", "glm-5.3-flash", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.fixture
def engine(request):
    address, message = request.param
    server = serve(address, message)
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    "engine",
    [
        ("127.0.0.1", {"role": "assistant", "content": "OK"}),
        ("127.0.0.1", {"content": None, "reasoning_content": "Hm."}),
    ],
    indirect=True,
)
def test_a_real_answer_is_ready(engine):
    r = ready("127.0.0.1", engine.server_address[1], "--once")
    assert r.returncode == 0, r.stderr
    assert "ready after" in r.stdout


@pytest.mark.parametrize(
    "engine",
    [
        ("127.0.0.1", {"role": "assistant", "content": ""}),
        ("127.0.0.1", {"content": "  \n", "reasoning_content": None}),
    ],
    indirect=True,
)
def test_an_empty_answer_is_not_ready_and_says_why(engine):
    r = ready("127.0.0.1", engine.server_address[1], "--once")
    assert r.returncode == 1
    assert "answered with an empty message" in r.stderr, r.stderr


@pytest.mark.parametrize("engine", [("127.0.0.7", {"content": "OK"})], indirect=True)
def test_an_engine_on_one_address_is_asked_there(engine):
    port = engine.server_address[1]
    assert ready("127.0.0.7", port, "--once").returncode == 0
    # the old probe (always 127.0.0.1) finds nothing there: the same port on 127.0.0.1 bound by the
    # test and not listening, so nothing else can answer it meanwhile
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        missed = ready("127.0.0.1", port, "--once")
    assert missed.returncode == 1 and "no completion from http://127.0.0.1:" in missed.stderr


@pytest.mark.parametrize("engine", [("127.0.0.1", {"content": "OK"})], indirect=True)
def test_a_wildcard_listen_address_is_asked_on_loopback(engine):
    assert ready("0.0.0.0", engine.server_address[1], "--once").returncode == 0


@pytest.mark.parametrize("engine", [("127.0.0.1", {"content": ""})], indirect=True)
def test_while_waiting_it_says_why_and_for_how_long(engine):
    r = ready("127.0.0.1", engine.server_address[1], "--timeout", "6")
    assert r.returncode == 1
    assert "not ready after 0 s of 6 s: glm-5.3-flash answered with an empty message" in r.stdout, r.stdout
