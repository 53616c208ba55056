"""Fetch real wheels from PyPI into the cache and pull single files out of them.

Wheels land under ${GLM_FLASH_CACHE:-~/.cache/glm-flash}/wheels, verified against the
sha256 PyPI publishes. A stamp file remembers the filename and digest, so a second run
needs no network. Members are read from the wheel zip directly; nothing is installed.
"""

from __future__ import annotations

import hashlib
import os
import urllib.parse
import zipfile
from pathlib import Path

import requests

PYPI = os.environ.get("GLM_FLASH_PYPI", "https://pypi.org/pypi")
FETCHED: list[str] = []


def cache_dir() -> Path:
    base = os.environ.get("GLM_FLASH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "glm-flash")
    p = Path(base)
    p.mkdir(parents=True, exist_ok=True)
    return p


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pick(files: list[dict], name: str, version: str) -> dict:
    wheels = [f for f in files if f["filename"].endswith(".whl")
              and ("none-any" in f["filename"] or "x86_64" in f["filename"])]
    if len(wheels) != 1:
        raise RuntimeError(f"{name}=={version}: expected one x86_64 or pure wheel on PyPI, found "
                           f"{[f['filename'] for f in files]}")
    return wheels[0]


def wheel(name: str, version: str) -> Path:
    """Path of the verified wheel in the cache; downloads it only when missing or corrupt."""
    d = cache_dir() / "wheels"
    d.mkdir(exist_ok=True)
    stamp = d / f"{name}-{version}.sha256"
    if stamp.exists():
        fname, digest = stamp.read_text().split()
        path = d / fname
        if path.exists() and path.stat().st_size and sha256_file(path) == digest:
            return path
    url = f"{PYPI}/{name}/json"
    r = requests.get(url, timeout=60)
    r.raise_for_status()
    info = _pick(r.json()["releases"].get(version) or [], name, version)
    path, digest = d / info["filename"], info["digests"]["sha256"]
    if not (path.exists() and sha256_file(path) == digest):
        part = path.with_name(path.name + ".part")
        # resume a partial download where the server allows it
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        with requests.get(urllib.parse.urljoin(url, info["url"]), stream=True, timeout=120, headers=headers) as resp:
            resp.raise_for_status()
            mode = "ab" if have and resp.status_code == 206 else "wb"
            with open(part, mode) as f:
                for block in resp.iter_content(1 << 20):
                    f.write(block)
        got = sha256_file(part)
        if got != digest:
            part.unlink()
            raise RuntimeError(f"{info['filename']}: sha256 {got} does not match PyPI's {digest}")
        part.replace(path)
        FETCHED.append(info["filename"])
    stamp.write_text(f"{info['filename']} {digest}\n")
    return path


def extract(whl: Path, members: list[str], dest: Path) -> Path:
    """Copy the named members (paths inside the wheel) under dest, keeping their paths."""
    with zipfile.ZipFile(whl) as z:
        for m in members:
            out = dest / m
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(m))
    return dest


def extract_package(whl: Path, top: str, dest: Path) -> Path:
    """Copy every member under the top-level package `top`/ (e.g. 'sglang') to dest."""
    with zipfile.ZipFile(whl) as z:
        for m in z.namelist():
            if m.startswith(top + "/") and not m.endswith("/"):
                out = dest / m
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(m))
    return dest
