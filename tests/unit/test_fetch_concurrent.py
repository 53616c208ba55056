"""control.engine_lock.fetch when several fetchers want the same file at once (workers of a fleet on
a cold cache, two sessions sharing it). Real HTTP from a local stand-in of PyPI's simple index whose
file download is slow, so the fetchers overlap; real threads and a real cache directory."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from control import engine_lock
from control.engine_lock import Pin, fetch

WHEEL = "tinypkg-1.0-py3-none-any.whl"
BODY = bytes(range(256)) * 4096  # 1 MiB
DIGEST = hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def index(monkeypatch):
    served = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/simple/"):
                url = f"http://127.0.0.1:{self.server.server_port}/files/{WHEEL}"
                body = json.dumps({"files": [{"filename": WHEEL, "url": url, "hashes": {"sha256": DIGEST}}]}).encode()
            else:
                served.append(self.path)
                body = BODY
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for i in range(0, len(body), 1 << 16):  # slowly: the fetchers' downloads overlap
                self.wfile.write(body[i : i + (1 << 16)])
                time.sleep(0.01)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(engine_lock, "PYPI_SIMPLE", f"http://127.0.0.1:{server.server_port}/simple")
    yield served
    server.shutdown()


def test_fetchers_of_one_file_at_once_all_get_it_and_leave_no_partial_file(index, tmp_path):
    pin = Pin("tinypkg", "1.0", (DIGEST,))
    results, errors = [], []

    def one():
        try:
            results.append(fetch([pin], dest=tmp_path, log=lambda *_: None))
        except Exception as e:  # noqa: BLE001 - the test reports whatever a fetcher raised
            errors.append(repr(e))

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(index) >= 2, "the downloads did not overlap: the test proves nothing"
    assert [r for r in results if r != [tmp_path / WHEEL]] == []
    assert (tmp_path / WHEEL).read_bytes() == BODY
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.txt", WHEEL, WHEEL + ".sha256"]
    assert (tmp_path / "index.txt").read_text() == f"tinypkg==1.0 {WHEEL}\n"


def test_a_fetcher_that_finds_the_file_complete_uses_it(index, tmp_path):
    pin = Pin("tinypkg", "1.0", (DIGEST,))
    fetch([pin], dest=tmp_path, log=lambda *_: None)
    assert fetch([pin], dest=tmp_path, log=lambda *_: None) == [tmp_path / WHEEL]
    assert len(index) == 1
