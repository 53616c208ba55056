"""control/pypi_cache.wheel() when two processes ask for the same wheel at once (the test runs
beside each other in tests/conftest.py BACKGROUND share one cache): one downloads, the other waits
and finds it; neither reads a file the other is still writing.

Simulated: PyPI (its JSON API and the file), a local HTTP server that sends the wheel slowly so
the two fetches overlap."""

from __future__ import annotations

import hashlib
import http.server
import json
import multiprocessing
import threading

import pytest

from control import pypi_cache

BODY = bytes(range(256)) * 4096  # 1 MiB
NAME, VERSION, FILE = "demo-pkg", "1.0", "demo_pkg-1.0-py3-none-any.whl"


class Slow(http.server.BaseHTTPRequestHandler):
    gets: list[str] = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        Slow.gets.append(self.path)
        if self.path.endswith("/json"):
            digest = hashlib.sha256(BODY).hexdigest()
            body = json.dumps(
                {"releases": {VERSION: [{"filename": FILE, "url": f"/files/{FILE}", "digests": {"sha256": digest}}]}}
            ).encode()
        else:
            body = BODY
        start = 0
        if self.headers.get("Range"):
            start = int(self.headers["Range"].split("=")[1].rstrip("-"))
            self.send_response(206)
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        for i in range(start, len(body), 64 << 10):  # 16 blocks, 50 ms apart: a fetch takes ~0.8 s
            self.wfile.write(body[i : i + (64 << 10)])
            self.wfile.flush()
            if not self.path.endswith("/json"):
                threading.Event().wait(0.05)


@pytest.fixture
def pypi(monkeypatch, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(pypi_cache, "PYPI_JSON", f"http://127.0.0.1:{server.server_port}/pypi")
    monkeypatch.setenv("GLM_FLASH_CACHE", str(tmp_path / "cache"))
    Slow.gets.clear()
    yield server
    server.shutdown()


def fetch(results) -> None:
    try:
        path = pypi_cache.wheel(NAME, VERSION, accept=("none-any",))
        results.put(("ok", path.read_bytes() == BODY))
    except Exception as e:  # reported to the test
        results.put(("error", f"{type(e).__name__}: {e}"))


def test_two_processes_fetching_one_wheel_both_get_it_whole_and_it_is_downloaded_once(pypi):
    ctx = multiprocessing.get_context("fork")  # the children inherit the patched PyPI address
    results = ctx.Queue()
    procs = [ctx.Process(target=fetch, args=(results,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    got = [results.get(timeout=5) for _ in procs]
    assert got == [("ok", True), ("ok", True)], got
    assert Slow.gets.count(f"/files/{FILE}") == 1, Slow.gets  # the second found the first's file
