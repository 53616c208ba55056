"""Files from PyPI in the control machine's cache, each checked against its sha256.

One place for what control/engine_lock.py (the engine wheelhouse), control/python_pack.py and the test
helpers tests/engine/pypi.py and tests/cuda/cuda_assets.py (single wheels) share:

- cache_root() / cache_dir(): ${GLM_FLASH_CACHE:-~/.cache/glm-flash} (cache_dir() creates it);
- sha256_file(path); distrust(stat): a cached file someone else could have written;
- identity(stat), private(path), write_whole(path, data): what a recorded sha256 is of, written whole;
- release_wheel(name, version, accept): the one wheel of a release, from PyPI's JSON API
  (${GLM_FLASH_PYPI:-https://pypi.org/pypi}/<name>/json): filename, absolute url, sha256;
- download(url, path, sha256): into `<path>.part`, renamed to `path` only when the hash matches;
- wheel(name, version, accept): the verified wheel in `<cache>/wheels`, fetched only when missing
  or corrupt; a stamp (`<name>-<version>.sha256`: filename and digest) lets a second run skip
  the network.

Control machine only (stdlib and `requests`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import stat
import sys
import urllib.parse
from pathlib import Path

PYPI_JSON = os.environ.get("GLM_FLASH_PYPI", "https://pypi.org/pypi")


class HashMismatch(RuntimeError):
    """A downloaded file whose sha256 is not the expected one (the partial file is deleted)."""

    def __init__(self, filename: str, got: str, want: str):
        super().__init__(f"{filename}: sha256 {got} does not match PyPI's {want}")
        self.filename, self.got, self.want = filename, got, want


class FetchError(RuntimeError):
    """A file or index page that could not be fetched: one line naming what and from where."""

    def __init__(self, what: str, url: str, reason: str):
        super().__init__(f"could not fetch {what} from {url}: {reason}")
        self.what, self.url, self.reason = what, url, reason


def network_reason(e: Exception) -> str:
    """The innermost cause of a requests/urllib error, without the traceback's noise."""
    while e.__cause__ is not None or e.__context__ is not None:
        inner = e.__cause__ or e.__context__
        if not str(inner):
            break
        e = inner
    return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else 'no answer'}"


def http():
    """`requests`, imported on first use: a converged deploy fetches nothing, and the import is
    70-100 ms of every run's start."""
    import requests

    return requests


def progress(msg: str) -> None:
    """Progress of control-machine work: stderr, since stdout belongs to pyinfra (--json)."""
    print(f"glm-flash: {msg}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    base = os.environ.get("GLM_FLASH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "glm-flash")
    return Path(base)


def cache_dir() -> Path:
    """cache_root(), created when missing."""
    p = cache_root()
    p.mkdir(parents=True, exist_ok=True)
    return p


def distrust(st: os.stat_result) -> str | None:
    """Why a cached file or directory with this stat may have been written by someone else, or
    None: it must belong to this user and be writable by nobody else (a shared or group-writable
    cache could otherwise steer what this machine runs on every host)."""
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"its group or others may write it (mode {st.st_mode & 0o7777:04o})"
    return None


class UntrustedCache(Exception):
    """A cache tree this machine would execute or pack holds what someone else may have written."""


def untrusted(tree: Path, top: Path | None = None) -> str | None:
    """Why `tree`, a cache directory whose files this machine executes or packs (uv's CPython, the
    tools venv), may hold what someone else wrote, or None. Each directory from `top` (the cache
    root) down to the tree, and every entry in it, must pass distrust(); a link must stay in the
    tree or point into the interpreter running this (a venv's python). Walked whole on every use:
    a planted .pth or an edited os.py would otherwise run on this machine and, packed, as root on
    every host."""
    top = Path(top or cache_root())
    chain = [Path(tree), *Path(tree).parents]  # the tree and its directories up to top (or /)
    chain = chain[: chain.index(top) + 1] if top in chain else chain
    for d in reversed(chain):
        st = os.lstat(d)
        if stat.S_ISLNK(st.st_mode):  # a link of this user's own to a directory that passes too
            if st.st_uid != os.geteuid():
                return f"{d}: the link belongs to uid {st.st_uid}, not to this user"
            st = os.stat(d)
        why = distrust(st)
        if why:
            return f"{d}: {why}"
    inside = [os.path.realpath(tree), os.path.realpath(sys.base_prefix)]
    for root, dirs, files in os.walk(tree):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                target = os.path.realpath(path)
                if st.st_uid != os.geteuid():
                    return f"{path}: the link belongs to uid {st.st_uid}, not to this user"
                if not any(target == t or target.startswith(t + os.sep) for t in inside):
                    return f"{path}: it links out of the tree, to {target}"
                continue
            why = distrust(st)
            if why:
                return f"{path}: {why}"
    return None


def trusted(tree: Path, what: str) -> Path:
    """`tree` when untrusted() finds nothing, else UntrustedCache saying what and how to fix it."""
    why = untrusted(tree)
    if why:
        raise UntrustedCache(
            f"the cache's {what} ({tree}) is not trusted: {why}. Fix: remove {tree} (it is installed "
            f"again on the next run) and keep {cache_root()} writable by this user only"
        )
    return tree


def identity(st: os.stat_result) -> str:
    """A cached file's identity for the sha256 recorded of it. ctime too: only the kernel sets it,
    on every write, rename or utime, so bytes changed and the mtime set back (same size, same
    second) do not pass as the file that was hashed."""
    return f"{st.st_size} {st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns}"


def private(path: Path) -> Path:
    """A name beside `path` that no other writer (thread, process, session sharing the cache) uses."""
    return path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(6)}")


def write_whole(path: Path, data: str | bytes, mode: int = 0o644, sync: bool = False) -> None:
    """`data` into `path` with `mode` (whatever the umask), whole: written under a private() name
    (O_EXCL, O_NOFOLLOW) and renamed into place, so a run killed while it writes leaves the old file
    or the new, never half of one. `sync`: on disk before it counts (the file and its directory
    synced), for what is not written again when lost (the model lock, the fleet's authority)."""
    tmp = private(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data.encode() if isinstance(data, str) else data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if sync:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def release_wheel(name: str, version: str, accept: tuple[str, ...] = ("x86_64",)) -> dict:
    """{filename, url, sha256} of the one wheel of name==version on PyPI whose filename contains
    one of `accept` (e.g. "x86_64", "none-any"); more or fewer than one is an error."""
    url = f"{PYPI_JSON}/{name}/json"
    r = http().get(url, timeout=60)
    r.raise_for_status()
    files = r.json()["releases"].get(version) or []
    wheels = [f for f in files if f["filename"].endswith(".whl") and any(a in f["filename"] for a in accept)]
    if len(wheels) != 1:
        raise RuntimeError(
            f"{name}=={version}: expected one {' or '.join(accept)} wheel on PyPI, found "
            f"{[f['filename'] for f in files]}"
        )
    w = wheels[0]
    return {"filename": w["filename"], "url": urllib.parse.urljoin(url, w["url"]), "sha256": w["digests"]["sha256"]}


def download(url: str, path: Path, sha256: str, *, session=None, timeout: int = 120, resume: bool = False) -> None:
    """Fetch `url` into `<path>.part` and rename it to `path` once its sha256 is `sha256`; on a
    mismatch the partial file is deleted and HashMismatch raised. resume: continue a partial
    file left by an interrupted run (HTTP Range), when the server allows it."""
    session = session or http()
    part = path.with_name(path.name + ".part")
    have = part.stat().st_size if resume and part.exists() else 0
    if have and sha256_file(part) == sha256:  # complete, but the run died before the rename
        part.replace(path)
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    with session.get(url, stream=True, timeout=timeout, headers=headers) as resp:
        resp.raise_for_status()
        mode = "ab" if have and resp.status_code == 206 else "wb"
        with open(part, mode) as f:
            for block in resp.iter_content(1 << 20):
                f.write(block)
    got = sha256_file(part)
    if got != sha256:
        part.unlink()
        raise HashMismatch(path.name, got, sha256)
    part.replace(path)


def wheel(name: str, version: str, accept: tuple[str, ...] = ("x86_64",), fetched: list | None = None) -> Path:
    """Path of the verified wheel in `<cache>/wheels`; downloads it only when missing or corrupt
    (resuming a partial download). The filename is appended to `fetched` when it was downloaded.
    Test runs beside each other share the cache (tests/conftest.py BACKGROUND): one fetches a wheel
    under a lock of its own while the others wait, then find it."""
    d = cache_dir() / "wheels"
    d.mkdir(exist_ok=True)
    with open(d / f"{name}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = d / f"{name}-{version}.sha256"  # filename + sha256, so a cached run needs no network
        if stamp.exists():
            fname, digest = stamp.read_text().split()
            path = d / fname
            if path.exists() and sha256_file(path) == digest:
                return path
        info = release_wheel(name, version, accept)
        path, digest = d / info["filename"], info["sha256"]
        if not (path.exists() and sha256_file(path) == digest):
            download(info["url"], path, digest, resume=True)
            if fetched is not None:
                fetched.append(info["filename"])
        stamp.write_text(f"{info['filename']} {digest}\n")
        return path
