"""A tiny stand-in for the Hugging Face hub on 127.0.0.1, for the real huggingface-hub client.

Serves one model repo from memory: the metadata API (model info with file metadata, the
tree listing) and /resolve/ downloads with HEAD, ETag, X-Repo-Commit and Range, as the
hub does for non-Xet files. With a token set it answers 401 without `Authorization:
Bearer <token>`. It records every request (method, path, whether the token came) and can
serve one file with wrong bytes (same size) to prove verification, or trickle data so a
test can look at the running downloader's processes. A network that fails: `drops` makes the
first GETs of `drop_file` send that many body bytes each (None: all of it) and then close the
connection, as a dropped link does mid-file (0: before any header); `rate` caps the bytes per
second all file downloads share, like the box's link (the small metadata answers are not held back). `served` counts the body bytes sent per file.

Run as a program it serves a directory on a fixed loopback port and appends every request to
a log file (one JSON line each): the sandbox's hub (sandbox/sandbox.py starts it, like the
NVIDIA stand-in), so a test can count what the deploy asked for.

    python fake_hub.py --repo ID --dir DIR --port PORT --log FILE [--commit SHA] [--token-file F] [--rate B/S]
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class FakeHub:
    def __init__(
        self,
        repo: str,
        files: dict[str, bytes],
        token: str | None = None,
        commit: str = "c0ffee" * 6 + "beef",
        corrupt: str | None = None,
        delay: float = 0.0,
        port: int = 0,
        log: Path | None = None,
        drop_file: str | None = None,
        drops: list[int | None] | None = None,
        rate: float = 0.0,
        address: str = "127.0.0.1",
    ):
        self.repo, self.files, self.token, self.commit = repo, files, token, commit
        self.corrupt, self.delay = corrupt, delay
        self.drop_file, self.drops, self.rate = drop_file, list(drops or []), rate
        self.served: dict[str, int] = {}
        self.lock = threading.Lock()
        self.next_send = 0.0  # rate: when the link is free for the next chunk
        self.requests: list[tuple[str, str, bool]] = []
        self.log = log
        self.also: list[FakeHub] = []  # more repos on the same endpoint (add_repo)
        hub = outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _authorized(self):
                got = self.headers.get("Authorization", "")
                ok = hub.token is not None and got == f"Bearer {hub.token}"
                hub.requests.append((self.command, self.path, ok))
                self.token_ok = ok
                return hub.token is None or ok

            def _send(self, code, body=b"", headers=None, head=False, name=None):
                cut = None
                if name is not None and name == hub.drop_file and not head:
                    with hub.lock:
                        if hub.drops:
                            cut = hub.drops.pop(0)
                if cut == 0:  # the link goes before any answer
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(code)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header(
                    "Content-Length",
                    str(len(body)) if not (headers or {}).get("Content-Length") else headers["Content-Length"],
                )
                self.end_headers()
                if hub.log:  # the bytes too: the fleet bench counts what crossed the "outside" link
                    entry = {"method": self.command, "path": self.path, "token": self.token_ok, "status": code}
                    with open(hub.log, "a") as f:
                        sent = 0 if head else len(body) if cut is None else min(cut, len(body))
                        f.write(json.dumps({**entry, "bytes": sent}) + "\n")
                if not head and body:
                    # with a low rate, small writes: a slow file is then half-sent for a while
                    chunk = max(1, min(4096, int(hub.rate // 4))) if hub.rate and name is not None else 4096
                    for i in range(0, len(body), chunk):
                        part = body[i : i + chunk] if cut is None else body[i : min(i + chunk, cut)]
                        if not part:
                            break
                        if name is not None:  # a file's bytes (the metadata answers are not held back)
                            hub.pace(len(part))
                        self.wfile.write(part)
                        if name is not None:
                            with hub.lock:
                                hub.served[name] = hub.served.get(name, 0) + len(part)
                        if hub.delay:
                            time.sleep(hub.delay)
                    if cut is not None:  # the link goes mid-file
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)

            def _json(self, data):
                self._send(200, json.dumps(data).encode(), {"Content-Type": "application/json"})

            def do_HEAD(self):
                self._route(head=True)

            def do_GET(self):
                self._route(head=False)

            def _route(self, head):
                if not self._authorized():
                    return self._send(
                        401,
                        b'{"error":"Invalid credentials"}',
                        {"Content-Type": "application/json", "X-Error-Code": "GatedRepo", "X-Error-Message": "gated"},
                        head,
                    )
                url = urlparse(self.path)
                path = unquote(url.path)
                hub = outer.serving(path)
                api = f"/api/models/{hub.repo}/"
                if path.startswith(api + "revision/"):
                    return self._json(hub.info())
                if path.startswith(api + "tree/"):
                    return self._json(hub.tree())
                prefix = f"/{hub.repo}/resolve/"
                if path.startswith(prefix):
                    _rev, _, name = path[len(prefix) :].partition("/")
                    if name not in hub.files:
                        return self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                    body = hub.files[name]
                    if name == hub.corrupt:
                        body = bytes(b ^ 0xFF for b in body)
                    headers = {
                        "X-Repo-Commit": hub.commit,
                        "ETag": f'"{hub.etag(name)}"',
                        "Accept-Ranges": "bytes",
                        "Content-Type": "application/octet-stream",
                    }
                    if hub.is_lfs(name):
                        headers["X-Linked-Etag"] = f'"{hub.etag(name)}"'
                        headers["X-Linked-Size"] = str(len(body))
                    rng = self.headers.get("Range")
                    if rng and rng.startswith("bytes=") and not head:
                        start = int(rng[6:].split("-")[0] or 0)
                        headers["Content-Range"] = f"bytes {start}-{len(body) - 1}/{len(body)}"
                        return self._send(206, body[start:], headers, name=name)
                    if head:
                        headers["Content-Length"] = str(len(body))
                    return self._send(200, body, headers, head, name=name)
                return self._send(404, b"", {}, head)

        self.server = ThreadingHTTPServer((address, port), Handler)
        self.endpoint = f"http://{address}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def add_repo(self, repo: str, files: dict[str, bytes], commit: str) -> None:
        """Serve another repo from this endpoint too (the GB10 sandbox: the model and the drafter)."""
        other = copy.copy(self)
        other.repo, other.files, other.commit = repo, files, commit
        self.also.append(other)

    def serving(self, path: str) -> FakeHub:
        for other in self.also:
            if path.startswith((f"/api/models/{other.repo}/", f"/{other.repo}/resolve/")):
                return other
        return self

    def pace(self, n: int) -> None:
        """With a rate: wait until the shared link has carried the bytes sent before these n."""
        if not self.rate:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_send)
            self.next_send = start + n / self.rate
        if start > now:
            time.sleep(start - now)

    def is_lfs(self, name):
        return name.endswith(".safetensors")

    def blob_id(self, name):
        """git's object id, as the hub reports it: sha1 of "blob <size>\\0" + content."""
        data = self.files[name]
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def etag(self, name):
        data = self.files[name]
        return hashlib.sha256(data).hexdigest() if self.is_lfs(name) else self.blob_id(name)

    def info(self):
        siblings = []
        for name, data in sorted(self.files.items()):
            s = {"rfilename": name, "size": len(data), "blobId": self.blob_id(name)}
            if self.is_lfs(name):
                s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            siblings.append(s)
        return {
            "_id": "x",
            "id": self.repo,
            "modelId": self.repo,
            "sha": self.commit,
            "private": False,
            "gated": bool(self.token),
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "lastModified": "2026-01-01T00:00:00.000Z",
        }

    def tree(self):
        out = []
        for name, data in sorted(self.files.items()):
            e = {"type": "file", "path": name, "size": len(data), "oid": self.blob_id(name)}
            if self.is_lfs(name):
                e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            out.append(e)
        return out

    def downloads(self):
        return [p for m, p, _ in self.requests if m == "GET" and "/resolve/" in p]

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def read_dir(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


def main() -> None:
    ap = argparse.ArgumentParser(description="serve one model repo from a directory, like the hub")
    ap.add_argument("--repo", required=True)
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--port", required=True, type=int)
    ap.add_argument("--address", default="127.0.0.1", help="the loopback address to listen on")
    ap.add_argument("--log", required=True, type=Path)
    ap.add_argument("--commit", default="c0ffee" * 6 + "beef")
    ap.add_argument("--token-file", type=Path, help="answer 401 without this token")
    ap.add_argument("--rate", type=float, default=0.0, help="bytes per second all downloads share (0: no cap)")
    ap.add_argument(
        "--also",
        nargs=3,
        action="append",
        default=[],
        metavar=("REPO", "DIR", "COMMIT"),
        help="serve another repo from the same endpoint",
    )
    a = ap.parse_args()
    token = a.token_file.read_text().strip() if a.token_file else None
    hub = FakeHub(
        a.repo, read_dir(a.dir), token=token, commit=a.commit, port=a.port, log=a.log, rate=a.rate, address=a.address
    )
    for repo, path, commit in a.also:
        hub.add_repo(repo, read_dir(Path(path)), commit)
    print(f"fake hub for {a.repo}@{a.commit} on {hub.endpoint} (pid {os.getpid()})", flush=True)
    hub.server.serve_forever()


if __name__ == "__main__":
    main()
