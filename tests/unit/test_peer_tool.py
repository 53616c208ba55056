"""files/glm-flash-peer on this machine: real servers and aria2c on loopback, real files.

Needs aria2c (Debian's aria2, which the fleet's workers get from the packages op and `make deps`
installs here); without it these tests fail, they do not skip.
"""

from __future__ import annotations

import contextlib
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
TOKEN = "t" * 40


def served_port(line: str) -> int:
    """The port from the tool's `serving N files on ADDR:PORT` line (it binds --port 0 itself)."""
    assert "serving" in line, line
    return int(line.rsplit(":", 1)[1])


def make(root, files: dict[str, bytes], modes: dict[str, str] | None = None) -> str:
    lines = []
    for rel, data in files.items():
        mode = (modes or {}).get(rel, "644")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()} {len(data)} {mode} {rel}\n")
    return "".join(lines)


def tool(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=120, **kw)


def token_file(tmp_path, token=TOKEN):
    path = tmp_path / "token"
    path.write_text(token + "\n")
    path.chmod(0o600)
    return str(path)


class Server:
    def __init__(self, root, manifest, tmp_path, *extra, bind="127.0.0.1"):
        self.errors = open(tmp_path / f"serve-{id(self)}.err", "w+")  # noqa: SIM115 (closed by stop)
        self.proc = subprocess.Popen(
            [sys.executable, TOOL, "serve", str(root), str(manifest), "--bind", bind, "--port", "0"]
            + ["--token-file", token_file(tmp_path), *extra],
            stdout=subprocess.PIPE,
            stderr=self.errors,
            text=True,
        )
        line = self.proc.stdout.readline()
        self.url = f"http://{bind}:{served_port(line)}"

    def stop(self) -> int:
        """Bytes it sent, from its last line. What it wrote on stderr is in self.stderr."""
        self.proc.terminate()
        assert self.proc.wait(10) == 0
        out = self.proc.stdout.read()
        self.errors.seek(0)
        self.stderr = self.errors.read()
        self.errors.close()
        return int(out.rsplit("sent ", 1)[1].split()[0])


def get(url, token=TOKEN, headers=None):
    req = urllib.request.Request(
        url, headers={**({"Authorization": f"Bearer {token}"} if token else {}), **(headers or {})}
    )
    return urllib.request.urlopen(req, timeout=10)


@pytest.fixture
def seed(tmp_path):
    root = tmp_path / "seed"
    root.mkdir()
    text = make(root, {"wheels/a.whl": b"a" * 5000, "python/.py.tar.gz": b"p" * 300})
    (root / "secret").write_text("not in the manifest")
    manifest = tmp_path / "manifest.txt"
    manifest.write_text(text)
    server = Server(root, manifest, tmp_path)
    yield server.url, manifest, root
    server.stop()


def fetch(tmp_path, dest, manifest, *urls):
    args = ["fetch", str(dest), str(manifest), "--token-file", token_file(tmp_path)]
    for u in urls:
        args += ["--source", u]
    return tool(*args)


def test_fetch_copies_what_is_missing_with_modes_and_then_nothing(seed, tmp_path):
    url, manifest, src = seed
    dest = tmp_path / "peer"
    r = fetch(tmp_path, dest, manifest, url)
    assert r.returncode == 0, r.stderr
    assert "received 5300 bytes in 2 of 2 files" in r.stdout
    assert (dest / "wheels/a.whl").read_bytes() == b"a" * 5000
    assert (dest / "python/.py.tar.gz").stat().st_mode & 0o777 == 0o644
    assert not list(dest.rglob("*partial*")) and not list(dest.rglob("*.aria2"))
    again = fetch(tmp_path, dest, manifest, url)
    assert "received 0 bytes in 0 of 2 files" in again.stdout
    assert tool("missing", str(dest), str(manifest)).stdout == ""


def test_only_the_manifest_is_served(seed):
    url, _, _ = seed
    for path in ("/secret", "/../seed/secret", "/wheels/"):
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url + path)
        assert e.value.code == 404


def test_without_the_transfers_token_nothing_is_served(seed):
    url, _, _ = seed
    for token in (None, "x" * 40, TOKEN + "x"):
        with pytest.raises(urllib.error.HTTPError) as e:
            get(url + "/wheels/a.whl", token=token)
        assert e.value.code == 401
    assert get(url + "/wheels/a.whl").read() == b"a" * 5000
    assert sorted(get(url + "/.have").read().decode().split()) == ["python/.py.tar.gz", "wheels/a.whl"]


def test_a_client_outside_the_allowed_addresses_is_refused_even_with_the_token(tmp_path):
    root = tmp_path / "seed"
    manifest = tmp_path / "m.txt"
    root.mkdir()
    manifest.write_text(make(root, {"f.bin": b"z" * 10}))
    server = Server(root, manifest, tmp_path, "--allow", "127.0.0.9")
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            get(server.url + "/f.bin")  # from 127.0.0.1
        assert e.value.code == 403
    finally:
        server.stop()


def test_a_byte_range_is_served(seed):
    url, _, _ = seed
    r = get(url + "/wheels/a.whl", headers={"Range": "bytes=100-199"})
    assert r.status == 206 and r.headers["Content-Range"] == "bytes 100-199/5000" and r.read() == b"a" * 100


def test_the_server_stops_itself_when_idle(tmp_path):
    root = tmp_path / "seed"
    manifest = tmp_path / "m.txt"
    root.mkdir()
    manifest.write_text(make(root, {"f.bin": b"z" * 10}))
    server = Server(root, manifest, tmp_path, "--idle", "2")
    get(server.url + "/f.bin").read()
    started = time.monotonic()
    assert server.proc.wait(15) == 0
    assert 1.5 < time.monotonic() - started < 6
    assert "no request for 2 s: stopping" in server.proc.stdout.read()


def test_a_server_without_a_token_does_not_start(tmp_path):
    (tmp_path / "m.txt").write_text("")
    r = tool("serve", str(tmp_path), str(tmp_path / "m.txt"), "--bind", "127.0.0.1", "--port", "0")
    assert r.returncode != 0 and "needs --token-file or --token-credential" in r.stderr
    short = token_file(tmp_path, "abc")
    r = tool(
        "serve", str(tmp_path), str(tmp_path / "m.txt"), "--bind", "127.0.0.1", "--port", "0", "--token-file", short
    )
    assert r.returncode != 0 and "does not hold a token" in r.stderr


def test_pieces_come_from_every_holder(tmp_path):
    """Two servers hold the same 64 MiB file: aria2 takes segments from both; each sends part of it."""
    data = hashlib.sha256(b"seed").digest() * (2 << 20)  # 64 MiB
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    manifest = tmp_path / "m.txt"
    manifest.write_text(make(a, {"big.bin": data}))
    make(b, {"big.bin": data})
    sa, sb = Server(a, manifest, tmp_path), Server(b, manifest, tmp_path)
    try:
        r = fetch(tmp_path, tmp_path / "d", manifest, sa.url, sb.url)
    finally:
        sent = [sa.stop(), sb.stop()]
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "d" / "big.bin").read_bytes() == data
    assert all(s > 0 for s in sent) and sum(sent) >= len(data), sent
    assert max(sent) < len(data), sent


def test_a_client_that_hangs_up_mid_range_is_counted_for_what_it_got(tmp_path):
    """aria2 closes a segment's connection when another connection took the rest of it (seen under
    load in CI): the server counts the blocks that went out, writes no traceback, serves on."""
    import socket

    data = b"z" * (16 << 20)
    root = tmp_path / "r"
    root.mkdir()
    manifest = tmp_path / "m.txt"
    manifest.write_text(make(root, {"big.bin": data}))
    server = Server(root, manifest, tmp_path)
    try:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as c:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            c.sendall(f"GET /big.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
            got = 0
            while got < (2 << 20):
                got += len(c.recv(1 << 16))
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        assert get(f"{server.url}/big.bin").read() == data  # it serves on
    finally:
        sent = server.stop()
    assert len(data) + (1 << 20) <= sent < 2 * len(data), sent  # the whole second answer, and blocks of the first
    assert "Traceback" not in server.stderr, server.stderr


def test_a_file_only_one_server_holds_is_taken_from_it(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    manifest = tmp_path / "m.txt"
    manifest.write_text(make(a, {"x.bin": b"x" * 3000, "y.bin": b"y" * 3000}))
    make(b, {"x.bin": b"x" * 3000})
    sa, sb = Server(a, manifest, tmp_path), Server(b, manifest, tmp_path)
    try:
        r = fetch(tmp_path, tmp_path / "d", manifest, sb.url, sa.url)
    finally:
        sa.stop(), sb.stop()
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "d" / "y.bin").read_bytes() == b"y" * 3000


def test_wrong_bytes_from_the_peer_are_not_kept(seed, tmp_path):
    url, manifest, src = seed
    (src / "wheels/a.whl").write_bytes(b"b" * 5000)  # same size, other content
    dest = tmp_path / "peer"
    r = fetch(tmp_path, dest, manifest, url)
    assert r.returncode != 0 and "wheels/a.whl: sha256" in r.stderr and "nothing kept" in r.stderr
    assert not (dest / "wheels/a.whl").exists()
    assert not list((dest / "wheels").glob(".*partial"))


def test_a_peer_sending_too_much_keeps_nothing(tmp_path):
    data = b"x" * 100
    manifest = tmp_path / "m.txt"
    manifest.write_text(f"{hashlib.sha256(data).hexdigest()} 100 644 f.bin\n")

    class Liar(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            body = b"f.bin\n" if self.path == "/.have" else b"x" * (3 << 20)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Liar)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        r = fetch(tmp_path, tmp_path / "d", manifest, f"http://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
    assert r.returncode != 0
    assert not (tmp_path / "d" / "f.bin").exists()


@pytest.mark.parametrize(
    "line", ["0" * 64 + " 1 644 ../etc/passwd", "0" * 64 + " 1 644 /etc/passwd", "zz 1 644 a", "0" * 64 + " 1 a"]
)
def test_a_bad_manifest_line_is_refused(tmp_path, line):
    manifest = tmp_path / "m.txt"
    manifest.write_text(line + "\n")
    r = tool("missing", str(tmp_path), str(manifest))
    assert r.returncode != 0 and "not `sha256 size mode relpath`" in r.stderr


def test_the_token_is_never_on_a_command_line(seed, tmp_path):
    """ps shows argv: the server's and aria2c's hold the token's file, never the token."""
    out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert TOKEN not in out


class Trickle(http.server.ThreadingHTTPServer):
    """A holder that lists the file and then sends it one byte every half second (#36 item 8, L5)."""

    def __init__(self, rel: str, size: int):
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/.have":
                    body = rel.encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(size))
                self.end_headers()
                try:
                    for _ in range(size):
                        self.wfile.write(b"t")
                        self.wfile.flush()
                        time.sleep(0.5)
                except OSError:
                    pass

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.daemon_threads = True
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_a_holder_that_trickles_is_dropped_not_waited_for_forever(tmp_path):
    manifest = tmp_path / "m.txt"
    (tmp_path / "src").mkdir()
    manifest.write_text(make(tmp_path / "src", {"big.bin": b"b" * (1 << 20)}))
    trickle = Trickle("big.bin", 1 << 20)
    began = time.monotonic()
    try:
        r = fetch(tmp_path, tmp_path / "peer", manifest, f"http://127.0.0.1:{trickle.server_address[1]}")
    finally:
        trickle.shutdown()
        trickle.server_close()
    assert r.returncode != 0 and "big.bin: incomplete" in r.stdout + r.stderr, r.stdout + r.stderr
    assert time.monotonic() - began < 100  # aria2 dropped the slow connection (it would take 6 days)


def test_a_staged_fetch_writes_only_its_stage_and_adopt_copies_what_the_manifest_says(seed, tmp_path):
    """#36 M2: the fetch unit writes only its stage (ROOT is only read); root's `adopt` copies each
    file ROOT lacks out of the stage, hashed as copied, with the manifest's mode, then drops the
    staged copy. A staged copy that is not the manifest's, a link or a FIFO is not adopted."""
    import os

    url, manifest, _ = seed
    dest, stage = tmp_path / "peer", tmp_path / "stage"
    dest.mkdir()
    r = tool(
        "fetch", str(dest), str(manifest), "--token-file", token_file(tmp_path), "--source", url, "--stage", str(stage)
    )
    assert r.returncode == 0, r.stderr
    assert list(dest.iterdir()) == [] and (stage / "wheels/a.whl").read_bytes() == b"a" * 5000
    assert (stage / "wheels/a.whl").stat().st_mode & 0o777 == 0o600  # the manifest's mode comes with adopt
    r = tool("adopt", str(stage), str(dest), str(manifest))
    assert r.returncode == 0 and "adopted 2 files" in r.stdout, r.stderr
    assert (dest / "wheels/a.whl").read_bytes() == b"a" * 5000
    assert (dest / "python/.py.tar.gz").stat().st_mode & 0o777 == 0o644
    assert not (stage / "wheels/a.whl").exists() and tool("missing", str(dest), str(manifest)).stdout == ""

    # What the stage's owner could leave there instead: altered bytes, a link to a root file, a FIFO.
    (dest / "wheels/a.whl").unlink()
    (dest / "python/.py.tar.gz").unlink()
    (stage / "wheels/a.whl").write_bytes(b"b" * 5000)
    (stage / "python").rename(tmp_path / "elsewhere")
    (stage / "python").symlink_to(tmp_path / "elsewhere")  # a linked directory: not followed
    r = tool("adopt", str(stage), str(dest), str(manifest))
    assert r.returncode != 0 and "wheels/a.whl: the staged copy is not the manifest's" in r.stderr
    assert "adopted 0 files" in r.stdout and not list(dest.rglob("*.whl")) and not (dest / "python/.py.tar.gz").exists()
    (stage / "wheels/a.whl").unlink()
    os.mkfifo(stage / "wheels/a.whl")
    r = tool("adopt", str(stage), str(dest), str(manifest))  # a FIFO is skipped, not opened for a read that hangs
    assert r.returncode == 0 and "adopted 0 files" in r.stdout and not (dest / "wheels/a.whl").exists()


def test_a_fetch_reads_its_token_from_a_unit_credential(seed, tmp_path):
    url, manifest, _ = seed
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "peer-token").write_text(TOKEN)
    dest = tmp_path / "peer"
    r = tool(
        "fetch",
        str(dest),
        str(manifest),
        "--token-credential",
        "peer-token",
        "--source",
        url,
        env={"PATH": "/usr/bin:/bin", "CREDENTIALS_DIRECTORY": str(creds)},
    )
    assert r.returncode == 0 and "received 5300 bytes in 2 of 2 files" in r.stdout, r.stderr


@contextlib.contextmanager
def nothing_listens():
    """The URL of a gone server: a port held bound and never listening while the test runs (connection
    refused), so no other program can take it meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_holder_whose_server_is_gone_is_left_out_when_the_others_hold_everything(seed, tmp_path):
    """Seen in CI: one worker's server stopped by its idle time while the deploy waited on another
    worker's start; the receiver failed although the other holder had every file."""
    url, manifest, src = seed
    with nothing_listens() as gone:
        r = fetch(tmp_path, tmp_path / "d", manifest, gone, url)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"{gone}: connection refused (no server); taking its files from the others" in r.stdout, r.stdout
        assert (tmp_path / "d" / "wheels/a.whl").read_bytes() == (src / "wheels/a.whl").read_bytes()
        # With no server anywhere the fetch fails and says where nothing answered.
        r = fetch(tmp_path, tmp_path / "e", manifest, gone)
    assert r.returncode != 0 and f"no server answers at {gone} (connection refused)" in r.stderr, r.stderr
    assert not (tmp_path / "e" / "wheels/a.whl").exists()


def test_a_file_only_a_gone_server_held_fails_the_fetch_and_says_which(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    manifest = tmp_path / "m.txt"
    manifest.write_text(make(a, {"x.bin": b"x" * 3000}))
    b = tmp_path / "b"
    b.mkdir()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    holder_of_nothing = Server(b, empty, tmp_path)  # answers, holds none of the manifest
    try:
        with nothing_listens() as gone:
            r = fetch(tmp_path, tmp_path / "d", manifest, holder_of_nothing.url, gone)
    finally:
        holder_of_nothing.stop()
    assert r.returncode != 0, r.stdout + r.stderr
    assert f"no source holds x.bin (no server at {gone})" in r.stderr, r.stderr
