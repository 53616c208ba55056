"""`pyinfra --dry` changes nothing anywhere, this machine included, and fetches nothing; a real
run that cannot fetch says in one line what, from where, and changes no host.

The network is taken away the way every HTTP client here honours: the proxy variables point at
a port nothing listens on, so any request (requests, pip, uv) fails at once. The cache is an
empty directory (GLM_FLASH_CACHE), so nothing can be served from it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import REPO, SANDBOX_INVENTORY, sandbox_sh

pytestmark = pytest.mark.sandbox


_HELD: list[socket.socket] = []


def closed_port() -> int:
    """A port that refuses connections: bound here and never listening, and held for the whole run
    (closed, another program could take it and answer)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return s.getsockname()[1]


def offline_env(cache) -> dict:
    proxy = f"http://127.0.0.1:{closed_port()}"
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "pip_find_links")}
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[var] = env[var.lower()] = proxy
    return dict(env, GLM_FLASH_CACHE=str(cache), PIP_RETRIES="0", PIP_CONFIG_FILE=os.devnull, PYTHONUNBUFFERED="1")


def run_pyinfra(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", *args, SANDBOX_INVENTORY, "deploy.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )


def host_state() -> str:
    """What a run would change first on the sandbox: the engine tree and our configuration."""
    return sandbox_sh(
        "find /opt/glm-flash /etc/glm-flash -maxdepth 3 -printf '%p %s %T@\\n' 2>/dev/null | sort; "
        "readlink /opt/glm-flash/engine/current; true"
    ).stdout


def test_dry_run_writes_and_fetches_nothing(sandbox, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    before = host_state()
    run = run_pyinfra(offline_env(cache), "--dry")
    assert run.returncode == 0, run.stderr[-4000:]
    assert list(cache.iterdir()) == []  # no CPython packed, no tools venv, no wheel
    assert "dry run: the real run fetches them" in run.stderr + run.stdout
    assert host_state() == before


def test_real_run_without_network_names_what_it_could_not_fetch(sandbox, tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    before = host_state()
    run = run_pyinfra(offline_env(cache), "-y")
    out = run.stderr + run.stdout
    assert run.returncode != 0
    assert "Traceback" not in out
    # one message (said where the host fails and again in the end-of-deploy summary)
    problem = {line[line.index("could not fetch") :] for line in out.splitlines() if "could not fetch" in line}
    assert len(problem) == 1, out[-4000:]
    (message,) = problem
    assert " from http" in message and "Fix:" in message
    assert host_state() == before
