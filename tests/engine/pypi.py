"""Fetch real wheels from PyPI into the cache and pull single files out of them.

Wheels land under ${GLM_FLASH_CACHE:-~/.cache/glm-flash}/wheels, verified against the
sha256 PyPI publishes (control/pypi_cache.py). A stamp file remembers the filename and digest,
so a second run needs no network. Members are read from the wheel zip directly; nothing is
installed.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from control import pypi_cache  # noqa: E402
from control.pypi_cache import cache_dir  # noqa: E402,F401  (tests use pypi.cache_dir())

FETCHED: list[str] = []


def wheel(name: str, version: str) -> Path:
    """Path of the verified x86_64 or pure wheel in the cache; downloads it only when missing or corrupt."""
    return pypi_cache.wheel(name, version, accept=("none-any", "x86_64"), fetched=FETCHED)


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
