"""files/glm-flash-peer on this machine: a real server and fetcher on loopback, real files."""

from __future__ import annotations

import hashlib
import http.server
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.conftest import REPO

TOOL = str(REPO / "files" / "glm-flash-peer")


def served_port(line: str) -> int:
    """The port from the tool's `serving N files on ADDR:PORT` line (it binds --port 0 itself)."""
    assert "serving" in line, line
    return int(line.rsplit(":", 1)[1])


# The tool takes a port number, not a socket: where a test must name the port before the server
# starts, it holds it bound (not listening: connections are refused) until just before, and a
# server that then finds it taken (EADDRINUSE) is a collision, tried again a bounded number of times.
COLLISION_TRIES = 3


def make(root, files: dict[str, bytes], modes: dict[str, str] | None = None) -> str:
    lines = []
    for rel, data in files.items():
        mode = (modes or {}).get(rel, "644")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()} {len(data)} {mode} {rel}\n")
    return "".join(lines)


def tool(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=60, **kw)


@pytest.fixture
def seed(tmp_path):
    root = tmp_path / "seed"
    root.mkdir()
    text = make(root, {"wheels/a.whl": b"a" * 5000, "python/.py.tar.gz": b"p" * 300}, {"python/.py.tar.gz": "600"})
    (root / "secret").write_text("not in the manifest")
    manifest = tmp_path / "manifest.txt"
    manifest.write_text(text)
    proc = subprocess.Popen(
        [sys.executable, TOOL, "serve", str(root), str(manifest), "--bind", "127.0.0.1", "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert "serving 2 files" in line
    port = served_port(line)
    yield f"http://127.0.0.1:{port}", manifest, root
    proc.terminate()
    assert proc.wait(10) == 0
    assert "sent" in proc.stdout.read()


def test_fetch_copies_what_is_missing_with_modes_and_then_nothing(seed, tmp_path):
    url, manifest, src = seed
    dest = tmp_path / "peer"
    r = tool("fetch", url, str(dest), str(manifest))
    assert r.returncode == 0, r.stderr
    assert "received 5300 bytes in 2 of 2 files" in r.stdout
    assert (dest / "wheels/a.whl").read_bytes() == b"a" * 5000
    assert (dest / "python/.py.tar.gz").stat().st_mode & 0o777 == 0o600
    assert (dest / "wheels/a.whl").stat().st_mode & 0o777 == 0o644
    again = tool("fetch", url, str(dest), str(manifest))
    assert "received 0 bytes in 0 of 2 files" in again.stdout
    assert tool("missing", str(dest), str(manifest)).stdout == ""


def test_only_the_manifest_is_served(seed):
    url, _, _ = seed
    for path in ("/secret", "/../seed/secret", "/wheels/"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + path, timeout=5)
        assert e.value.code == 404


def test_wrong_bytes_from_the_peer_are_not_kept(seed, tmp_path):
    url, manifest, src = seed
    (src / "wheels/a.whl").write_bytes(b"b" * 5000)  # same size, other content
    dest = tmp_path / "peer"
    r = tool("fetch", url, str(dest), str(manifest))
    assert r.returncode != 0 and "wheels/a.whl: sha256" in r.stderr and "nothing kept" in r.stderr
    assert not (dest / "wheels/a.whl").exists()
    assert not list((dest / "wheels").glob(".*partial"))


def test_a_peer_sending_too_much_is_cut_off(tmp_path):
    data = b"x" * 100
    manifest = tmp_path / "m.txt"
    manifest.write_text(f"{hashlib.sha256(data).hexdigest()} 100 644 f.bin\n")

    class Liar(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"x" * (3 << 20))

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        r = tool("fetch", f"http://127.0.0.1:{httpd.server_address[1]}", str(tmp_path / "d"), str(manifest))
    finally:
        httpd.shutdown()
    assert r.returncode != 0 and "more than the manifest's 100 bytes" in r.stderr
    assert not (tmp_path / "d" / "f.bin").exists()


@pytest.mark.parametrize(
    "line", ["0" * 64 + " 1 644 ../etc/passwd", "0" * 64 + " 1 644 /etc/passwd", "zz 1 644 a", "0" * 64 + " 1 a"]
)
def test_a_bad_manifest_line_is_refused(tmp_path, line):
    manifest = tmp_path / "m.txt"
    manifest.write_text(line + "\n")
    r = tool("missing", str(tmp_path), str(manifest))
    assert r.returncode != 0 and "not `sha256 size mode relpath`" in r.stderr


def test_fetch_waits_for_a_server_still_starting(tmp_path):
    root = tmp_path / "seed"
    root.mkdir()
    manifest = tmp_path / "m.txt"
    manifest.write_text(make(root, {"f.bin": b"z" * 10}))
    for _ in range(COLLISION_TRIES):
        held = socket.socket()
        held.bind(("127.0.0.1", 0))  # bound, not listening: fetch is refused until the server starts
        port = held.getsockname()[1]
        fetch = subprocess.Popen(
            [sys.executable, TOOL, "fetch", f"http://127.0.0.1:{port}", str(tmp_path / "d"), str(manifest)],
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(1)  # not synchronisation: fetch is to meet a refused port at least once
        held.close()
        serve = subprocess.Popen(
            [sys.executable, TOOL, "serve", str(root), str(manifest), "--bind", "127.0.0.1", "--port", str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if "serving" in serve.stdout.readline():
            break
        err = serve.communicate(timeout=10)[1]
        fetch.kill()
        fetch.wait(10)
        assert "Address already in use" in err, err  # any other failure is the tool's
    else:
        pytest.fail(f"127.0.0.1:{port}: another program took the port between close and serve {COLLISION_TRIES} times")
    try:
        assert fetch.wait(30) == 0
        assert (tmp_path / "d" / "f.bin").read_bytes() == b"z" * 10
    finally:
        serve.terminate()
        serve.wait(10)
