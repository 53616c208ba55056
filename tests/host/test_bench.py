"""The deployed node performs like its field report: the bench's quick suite, held to a floor.

Decode at one stream must reach 80% of the report's number for the profile (L40S 18.3 tok/s,
GB10 ~29 tok/s on code; docs/sources.md §1). The engine listens on loopback unless an API
key protects it, so the bench goes through an SSH tunnel to the node's own 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLOOR = 0.8
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def free_port() -> int:
    """A port for ssh -L, which takes a number, not a socket: chosen free here, so another program can
    still take it before ssh binds. ssh then exits (ExitOnForwardFailure), and open_tunnel tries again."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TUNNEL_TRIES = 3


def ssh_tunnel(backend, local: int, remote: int) -> list[str]:
    """ssh -L with the same host, user, port, config and key testinfra connects with."""
    spec = backend.host
    cmd = [
        "ssh",
        "-N",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "BatchMode=yes",
        "-L",
        f"127.0.0.1:{local}:127.0.0.1:{remote}",
    ]
    if backend.ssh_config:
        cmd += ["-F", backend.ssh_config]
    if backend.ssh_identity_file:
        cmd += ["-i", backend.ssh_identity_file]
    if spec.port:
        cmd += ["-p", str(spec.port)]
    return cmd + [f"{spec.user}@{spec.name}" if spec.user else spec.name]


def wait_listening(port: int, proc: subprocess.Popen, seconds: float = 30) -> bool:
    """True once the tunnel listens; False when ssh could not bind the port (another program took it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read()
            if "Address already in use" in err or "cannot listen to port" in err:
                return False
            pytest.fail(f"ssh tunnel exited: {err[-500:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0 and proc.poll() is None:
                return True
        time.sleep(0.5)
    pytest.fail(f"ssh tunnel to the engine's port not up after {seconds:.0f} s")


def open_tunnel(backend, remote: int) -> tuple[subprocess.Popen, int]:
    """ssh -L on a free local port, chosen again when another program took it first (a bounded number of times)."""
    for _ in range(TUNNEL_TRIES):
        local = free_port()
        proc = subprocess.Popen(
            ssh_tunnel(backend, local, remote),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if wait_listening(local, proc):
            return proc, local
    pytest.fail(f"ssh -L: another program took the chosen local port {TUNNEL_TRIES} times")


@contextlib.contextmanager
def engine_url(host, profile):
    """The bench environment made, then the engine's URL as the control machine reaches it: through an
    SSH tunnel while the engine listens on loopback (closed on leaving), else directly."""
    done = subprocess.run(["make", "-s", "bench-venv"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    if profile.listen_host not in LOOPBACK:
        yield f"http://{host.backend.host.name}:{profile.port}"
        return
    if host.backend.NAME != "ssh":
        pytest.skip(
            f"not applicable: the engine listens on {profile.listen_host} and the {host.backend.NAME} "
            "connection cannot be tunnelled; check with --hosts ssh://..."
        )
    tunnel, local = open_tunnel(host.backend, profile.port)
    try:
        yield f"http://127.0.0.1:{local}"
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)


@pytest.mark.gpu
def test_quick_bench_reaches_the_field_reports_floor(host, profile, tmp_path):
    with engine_url(host, profile) as url:
        run = subprocess.run(
            [
                str(REPO / ".venv-bench/bin/python"),
                "-m",
                "benchmark",
                "--url",
                url,
                "--suite",
                "quick",
                "--platform",
                profile.platform,
                "--model",
                profile.served_model_name,
                "--api-key-env",
                profile.api_key_env,
                "--out",
                str(tmp_path / "bench"),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            env=dict(os.environ),
        )
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads((tmp_path / "bench" / "results.json").read_text())
    one = next(r for r in results["scenarios"] if r["name"] == "decode-1")
    field = next(f for f in one["field"] if f["metric"] == "decode_tok_s_per_stream")
    assert one["requests_failed"] == 0, one["errors"]
    got = one["decode_tok_s_per_stream"]["median"]
    assert got >= FLOOR * field["value"], (
        f"decode at 1 stream {got:.1f} tok/s is below {FLOOR:.0%} of {field['text']}; "
        f"report: {tmp_path / 'bench' / 'report.md'}"
    )
