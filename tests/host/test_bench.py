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
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FLOOR = 0.8
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def ssh_command(backend, *args: str) -> list[str]:
    """ssh with the same host, user, port, config and key testinfra connects with."""
    spec = backend.host
    cmd = ["ssh", "-o", "BatchMode=yes"]
    if backend.ssh_config:
        cmd += ["-F", backend.ssh_config]
    if backend.ssh_identity_file:
        cmd += ["-i", backend.ssh_identity_file]
    if spec.port:
        cmd += ["-p", str(spec.port)]
    return cmd + [*args, f"{spec.user}@{spec.name}" if spec.user else spec.name]


def to_pipe(conn: socket.socket, pipe) -> None:
    with contextlib.suppress(OSError, ValueError):
        while data := conn.recv(65536):
            pipe.write(data)
            pipe.flush()
    with contextlib.suppress(OSError):
        pipe.close()


def to_socket(pipe, conn: socket.socket) -> None:
    with contextlib.suppress(OSError, ValueError):
        while data := pipe.read1(65536):
            conn.sendall(data)
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)


class Tunnel:
    """The engine's remote loopback port on a local port of ours: a socket this process binds to port 0
    and holds until closed (no port chosen, released, then bound by ssh: another program cannot take
    it between), each connection carried by its own `ssh -W` (stdio forwarding over testinfra's SSH)."""

    def __init__(self, backend, remote: int):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.command = ssh_command(backend, "-W", f"127.0.0.1:{remote}")
        self.procs: list[subprocess.Popen] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # closed
                return
            proc = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
            self.procs.append(proc)
            threading.Thread(target=to_pipe, args=(conn, proc.stdin), daemon=True).start()
            threading.Thread(target=to_socket, args=(proc.stdout, conn), daemon=True).start()

    def close(self) -> None:
        self.listener.close()
        for proc in self.procs:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


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
    tunnel = Tunnel(host.backend, profile.port)
    try:
        yield f"http://127.0.0.1:{tunnel.port}"
    finally:
        tunnel.close()


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
