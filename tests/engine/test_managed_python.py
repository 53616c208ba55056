"""The engine's CPython without pyenv: the pinned uv downloads python-build-standalone's build
of `python_release`, checks it against the sha256 it carries, and the result packs like any
install tree.

Simulated: uv's real download host is not reachable here, so uv is pointed (its documented
UV_PYTHON_DOWNLOADS_JSON_URL) at a loopback server carrying a stand-in archive laid out like
python-build-standalone's "install_only" ones (`python/bin/python3.X`, `python/lib/...`), made
from this machine's CPython 3.11. uv itself, its download, hash check and install are real.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from control import python_pack
from control.engine_lock import tools_bin
from control.pypi_cache import cache_root

SOURCE = Path(os.environ.get("GLM_FLASH_PYTHON_SOURCE", "/root/.pyenv/versions/3.11.7"))
SKIP = (
    "lib/python3.11/test",
    "lib/python3.11/site-packages",
    "lib/python3.11/idlelib",
    "lib/python3.11/tkinter",
    "lib/python3.11/config-3.11-x86_64-linux-gnu",
    "lib/python3.11/ensurepip",
)


def version_of(tree: Path) -> str:
    return subprocess.run(
        [str(tree / "bin/python3"), "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    """(release, archive path, sha256) of a python-build-standalone-shaped archive."""
    if not (SOURCE / "bin/python3.11").exists():
        pytest.skip(f"needs a CPython 3.11 tree to make the stand-in from ({SOURCE}; GLM_FLASH_PYTHON_SOURCE)")
    release = version_of(SOURCE)
    out = tmp_path_factory.mktemp("pbs")
    archive = out / f"cpython-{release}+standin-x86_64-unknown-linux-gnu-install_only.tar.gz"

    def keep(info: tarfile.TarInfo):
        rel = info.name.split("/", 1)[1] if "/" in info.name else ""
        return None if any(rel == s or rel.startswith(s + "/") for s in SKIP) else info

    with tarfile.open(archive, "w:gz", compresslevel=1) as t:
        t.add(SOURCE, arcname="python", filter=keep)
    return release, archive, hashlib.sha256(archive.read_bytes()).hexdigest()


class Server:
    def __init__(self, root: Path):
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(root), **kw)

            def log_message(self, *a):
                outer.requests.append(self.path)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def env(tmp_path, monkeypatch, standin):
    """An empty cache (sharing only the pinned tools venv) and uv pointed at the loopback server."""
    tools = tools_bin().parent.parent  # installs uv into the real cache once
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tools").symlink_to(tools)
    monkeypatch.setenv("GLM_FLASH_CACHE", str(cache))
    release, archive, sha = standin
    server = Server(archive.parent)

    def listing(sha256: str = sha, url: str | None = None) -> None:
        entry = {
            "name": "cpython",
            "arch": {"family": "x86_64", "variant": None},
            "os": "linux",
            "libc": "gnu",
            "major": 3,
            "minor": 11,
            "patch": int(release.split(".")[2]),
            "prerelease": "",
            "variant": None,
            "url": url or f"{server.url}/{archive.name.replace('+', '%2B')}",
            "sha256": sha256,
            "build": "standin",
        }
        path = tmp_path / "downloads.json"
        path.write_text(json.dumps({f"cpython-{release}-linux-x86_64-gnu": entry}))
        monkeypatch.setenv("UV_PYTHON_DOWNLOADS_JSON_URL", str(path))

    listing()
    yield release, server, listing
    server.close()


def test_uv_installs_the_release_and_it_packs_into_a_working_interpreter(env, tmp_path, capfd):
    release, server, _ = env
    capfd.readouterr()
    tree = python_pack.managed_tree(release)
    assert tree == cache_root() / "python" / "uv" / f"cpython-{release}-linux-x86_64-gnu"
    assert version_of(tree) == release and len(server.requests) == 1
    assert python_pack.managed_tree(release) == tree and len(server.requests) == 1  # cached: no second download

    art = python_pack.pack(tree, "3.11")
    out, err = capfd.readouterr()
    # on a cold cache too, stdout stays pyinfra's (`--json`): progress goes to stderr
    assert out == "" and f"downloading CPython {release}" in err and "packing" in err
    dest = tmp_path / "host" / art.name
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-xzf", str(art.path), "-C", str(dest)], check=True)
    r = subprocess.run(
        [str(dest / "bin/python3.11"), "-I", "-c", "import ssl, sqlite3, ctypes, json, sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and r.stdout.strip() == str(dest), r.stderr


def test_a_download_whose_hash_differs_is_refused_and_nothing_installed(env):
    release, server, listing = env
    listing(sha256="a" * 64)
    with pytest.raises(python_pack.PythonSourceError) as e:
        python_pack.managed_tree(release)
    assert "Hash mismatch" in str(e.value) and len(server.requests) == 1
    assert not (cache_root() / "python" / "uv" / f"cpython-{release}-linux-x86_64-gnu" / "bin" / "python3").exists()


def test_an_unreachable_download_is_one_line_naming_where(env):
    release, server, listing = env
    server.close()
    listing(url="http://127.0.0.1:9/cpython.tar.gz")  # discard port: nothing listens
    with pytest.raises(python_pack.PythonSourceError) as e:
        python_pack.managed_tree(release)
    msg = str(e.value)
    assert "\n" not in msg and f"uv could not install CPython {release}" in msg
    assert "127.0.0.1:9/cpython.tar.gz" in msg, msg
