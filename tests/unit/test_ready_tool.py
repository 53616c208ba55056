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


# What sglang answers when a sampled request's kernel cannot be built (flashinfer runs `ninja` by
# name; not on the engine's PATH): the request fails, greedy ones (argmax, no kernel) still pass.
NO_NINJA = {"object": "error", "message": "FileNotFoundError: [Errno 2] No such file or directory: 'ninja'"}


def serve(address: str, message, sampled_fails: bool = False, port: int = 0):
    """An engine stand-in on `address`, `port` (0: the kernel's choice, read back from the socket);
    with `sampled_fails`, a request with a temperature above 0 gets a 500 (NO_NINJA)."""

    class Engine(BaseHTTPRequestHandler):
        def do_POST(self):
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.server.requests.append(request)
            if sampled_fails and request.get("temperature", 1.0) > 0:
                body = json.dumps(NO_NINJA).encode()
                self.send_response(500)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            body = json.dumps({"choices": [{"message": message}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((address, port), Engine)
    server.requests = []
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
    address, message, *sampled_fails = request.param
    server = serve(address, message, *sampled_fails)
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
    # one greedy request and one sampled, as clients send (generation_config's top_p applies to theirs)
    assert [(q.get("temperature"), q.get("top_p")) for q in engine.requests] == [(0, None), (0.7, 0.9)]


@pytest.mark.parametrize("engine", [("127.0.0.1", {"content": "OK"}, True)], indirect=True)
def test_greedy_answers_but_sampled_fails_is_not_ready_and_says_why(engine):
    """#35: an engine without ninja on its PATH answers temperature 0 (argmax) and dies on the
    first sampled request. Not ready, at once (waiting does not mend it), naming the cause."""
    r = ready("127.0.0.1", engine.server_address[1], "--timeout", "600")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "answered a greedy request but a sampled one (temperature 0.7, top_p 0.9) failed" in r.stderr, r.stderr
    assert "HTTP Error 500" in r.stderr and "No such file or directory: 'ninja'" in r.stderr, r.stderr
    assert len(engine.requests) == 2  # no waiting loop


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


def test_an_engine_on_one_address_is_asked_there():
    # the old probe (always 127.0.0.1) finds nothing there: the same port on 127.0.0.1 bound by the
    # test and not listening, so nothing else can answer it meanwhile. Held first, on a port the
    # kernel chose free on 127.0.0.1; the engine then takes it on 127.0.0.7 (the other order had to
    # hope that the engine's port was free on 127.0.0.1 too)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        engine = serve("127.0.0.7", {"content": "OK"}, port=port)
        try:
            found = ready("127.0.0.7", port, "--once")
            missed = ready("127.0.0.1", port, "--once")
        finally:
            engine.shutdown()
            engine.server_close()
    assert found.returncode == 0, found.stderr
    assert missed.returncode == 1 and "no completion from http://127.0.0.1:" in missed.stderr


@pytest.mark.parametrize("engine", [("127.0.0.1", {"content": "OK"})], indirect=True)
def test_a_wildcard_listen_address_is_asked_on_loopback(engine):
    assert ready("0.0.0.0", engine.server_address[1], "--once").returncode == 0


@pytest.mark.parametrize("engine", [("127.0.0.1", {"content": ""})], indirect=True)
def test_while_waiting_it_says_why_and_for_how_long(engine):
    r = ready("127.0.0.1", engine.server_address[1], "--timeout", "6")
    assert r.returncode == 1
    assert "not ready after 0 s of 6 s: glm-5.3-flash answered with an empty message" in r.stdout, r.stdout


def test_a_redirect_is_not_followed_and_the_key_stays_home(tmp_path):
    """Root asks the engine with the key (glm-flash status): an engine that redirects is not followed,
    so the key never goes where the engine points (#36 item 8, L2), and the answer is read bounded."""
    elsewhere = serve("127.0.0.1", {"content": "OK"})

    class Redirecting(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.1:{elsewhere.server_address[1]}/v1/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    engine = ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-key").write_text("sk-root-only-0123456789")
    try:
        r = subprocess.run(
            [sys.executable, str(TOOL), "--port", str(engine.server_address[1]), "--model", "m", "--once"],
            capture_output=True,
            text=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin", "CREDENTIALS_DIRECTORY": str(creds)},
        )
    finally:
        engine.shutdown()
        engine.server_close()
        elsewhere.shutdown()
        elsewhere.server_close()
    assert r.returncode == 1 and "not followed" in r.stderr, r.stderr
    assert elsewhere.requests == [], "the redirect was followed, with the key"


def test_readiness_stops_waiting_when_the_engines_process_is_gone():
    """Under the unit, $MAINPID is the engine: once it has exited no answer can come, so readiness
    fails within seconds instead of waiting out --timeout (a broken launch)."""
    with socket.socket() as s:  # a port nothing listens on: connection refused, as while loading
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = subprocess.Popen(["true"])
    gone.wait()
    env = {"PATH": "/usr/bin:/bin", "MAINPID": str(gone.pid)}
    run = subprocess.run(
        ["/usr/bin/python3", str(TOOL), "--port", str(port), "--model", "m", "--timeout", "120"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert run.returncode == 1 and f"the engine (pid {gone.pid}) exited" in run.stderr, run.stderr
    alive = subprocess.Popen(["sleep", "30"])
    try:
        env["MAINPID"] = str(alive.pid)
        waiting = subprocess.run(
            ["/usr/bin/python3", str(TOOL), "--port", str(port), "--model", "m", "--timeout", "6"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert waiting.returncode == 1 and "exited" not in waiting.stderr and "no completion" in waiting.stderr
    finally:
        alive.kill()
        alive.wait()
