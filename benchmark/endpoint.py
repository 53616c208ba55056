"""Where the bench connects: the URL given, or the node an inventory names.

From an inventory the address is the host's `ssh_hostname` (or its name) and the port is
the profile's `port` (control/profile.py build(), control/defaults.py); nothing else is tried.
"""

from __future__ import annotations

import os
import runpy
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from benchmark.client import BenchError

LOOPBACK = ("127.0.0.1", "::1", "localhost")


@dataclass
class Target:
    url: str
    host: str  # for the output folder's name
    platform: str | None  # l40s or gb10 when an inventory says so
    model: str | None  # the profile's served_model_name
    hint: str = ""  # added to a "cannot reach" line


def from_url(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"URL {url!r} is not http://HOST:PORT")
    if parts.username or parts.password:
        raise BenchError("put the API key in GLM_FLASH_API_KEY, not in the URL")
    return Target(url.rstrip("/"), parts.hostname, None, None)


def from_inventory(path: str, wanted: str | None, repo: Path) -> Target:
    # Inventories import control.profile and check themselves while loading: mistakes end here,
    # printed by the profile, before anything is contacted.
    from control.profile import ProfileError, build

    if not os.path.isfile(repo / path):
        raise BenchError(f"inventory {path} does not exist")
    old = os.getcwd()
    os.chdir(repo)
    try:
        entries = runpy.run_path(str(repo / path))["hosts"]
    finally:
        os.chdir(old)
    names = [name for name, _ in entries]
    if wanted:
        entries = [(n, d) for n, d in entries if wanted in (n, d.get("ssh_hostname"))]
    if len(entries) != 1:
        raise BenchError(f"{path} has host(s) {', '.join(names)}: name one with BENCH_HOST=<name>")
    name, data = entries[0]
    try:
        profile = build(name, data)
    except ProfileError as e:
        raise BenchError(str(e).splitlines()[0]) from None
    address = data.get("ssh_hostname") or name
    hint = ""
    if profile.listen_host in LOOPBACK and address not in LOOPBACK:
        hint = (
            f" (the node listens on {profile.listen_host} only: run the bench through "
            f"`ssh -L {profile.port}:127.0.0.1:{profile.port} {address}` with URL=http://127.0.0.1:{profile.port})"
        )
    host = f"[{address}]" if ":" in address else address
    return Target(f"http://{host}:{profile.port}", address, profile.platform, profile.served_model_name, hint)
