"""The sandbox tool itself, run from a checkout at a long path, as users clone into.

Each test copies `sandbox/` into a directory whose path is at least 120 characters and runs
it there: a checkout of its own, so its own machine name and the ports it chooses itself
(.sandbox/ports.json), and the suite's main sandbox is not touched. ssh refuses a
control socket path of 104 bytes or more: a sandbox that kept its sockets under the checkout
failed here with a misleading "SSH did not answer". Failures must name their real cause.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sandbox


def ports(root: Path) -> dict:
    return json.loads((root / ".sandbox/ports.json").read_text())


@pytest.fixture
def checkout(tmp_path):
    """A copy of the sandbox tool at a path of at least 120 characters."""
    base = tmp_path / "home" / "alice" / "src" / "github.com" / "acme-infrastructure" / "gpu-provisioning"
    root = base / ("glm-flash-node-" + "x" * max(0, 120 - len(str(base)) - 15))
    assert len(str(root)) >= 120
    for part in ("sandbox", "control"):  # control: the stand-in NVIDIA repository fetches through control/pypi_cache
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("GLM_FLASH_SANDBOX_PORT", "GLM_FLASH_STANDIN_PORT")}
    env.pop("GLM_FLASH_HUB_PORT", None)
    yield root, env
    subprocess.run([sys.executable, str(root / "sandbox/sandbox.py"), "destroy"], env=env, capture_output=True)


def tool(root: Path, env: dict, action: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "sandbox/sandbox.py"), action],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_boots_and_answers_ssh_from_a_long_path(checkout):
    root, env = checkout
    up = tool(root, env, "up")
    assert up.returncode == 0, up.stdout + up.stderr
    config = root / ".sandbox/ssh_config"
    r = subprocess.run(
        ["ssh", "-F", str(config), "sandbox", "systemctl is-system-running; hostname"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode in (0, 1) and r.stdout.split()[-1] == "sandbox", r.stderr
    # the connection went through a master socket (the part that broke at long paths)
    check = subprocess.run(["ssh", "-F", str(config), "-O", "check", "sandbox"], capture_output=True, text=True)
    assert check.returncode == 0 and "Master running" in check.stderr, check.stderr
    # a second `up` sees the running machine instead of booting another
    again = tool(root, env, "up")
    assert again.returncode == 0 and "already running" in again.stdout
    # the stand-in NVIDIA repository is served on loopback for the machine
    standin = ports(root)["standin"]
    url = f"http://127.0.0.1:{standin}/compute/cuda/repos/debian13/x86_64/InRelease"
    r = subprocess.run(
        [
            "ssh",
            "-F",
            str(config),
            "sandbox",
            f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/"
            f"{standin}; printf \"GET {url[url.index('/compute') :]} HTTP/1.0\\r\\n\\r\\n\" >&3; "
            f"head -c 1000 <&3'",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "200 OK" in r.stdout and "BEGIN PGP SIGNED MESSAGE" in r.stdout, r.stdout + r.stderr


def test_a_snapshot_keeps_the_machine_and_reset_goes_back_to_it(checkout):
    """`snapshot` keeps the machine as it is (its root read-only, the machine on an overlay of it),
    `reset` throws away what it wrote since, `destroy` removes every layer."""
    root, env = checkout

    def sh(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-F", str(root / ".sandbox/ssh_config"), "sandbox", command],
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = tool(root, env, "reset")
    assert refused.returncode != 0 and "no snapshot" in refused.stderr and "Traceback" not in refused.stderr
    assert tool(root, env, "up").returncode == 0
    assert sh("echo kept > /root/before").returncode == 0
    kept = tool(root, env, "snapshot")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    lower = root / ".sandbox/rootfs.lower"
    assert (lower / "root/before").read_text() == "kept\n"
    assert tool(root, env, "status").stdout.strip() == "running"  # it was up: it is up again
    assert sh("echo thrown > /root/after; cat /root/before").stdout == "kept\n"
    assert not (lower / "root/after").exists()  # the snapshot does not change
    again = tool(root, env, "snapshot")
    assert again.returncode != 0 and "already runs on a snapshot" in again.stderr
    back = tool(root, env, "reset")
    assert back.returncode == 0, back.stdout + back.stderr
    assert sh("ls /root").stdout.split() == ["before"]
    # a fleet booted on the snapshot (sandbox/fleet.py up --from-sandbox) keeps it from being deleted
    (root / ".sandbox/fleet").mkdir()
    (root / ".sandbox/fleet/from-sandbox").touch()
    kept = tool(root, env, "destroy")
    assert kept.returncode != 0 and "fleet.py down" in kept.stderr and (lower / "root/before").exists()
    (root / ".sandbox/fleet/from-sandbox").unlink()
    assert tool(root, env, "destroy").returncode == 0
    assert not any((root / ".sandbox" / name).exists() for name in ("rootfs.lower", "rootfs.upper", "rootfs.work"))
    assert not (root / ".sandbox/rootfs").exists()


def test_ssh_failure_is_reported_with_ssh_own_message(checkout):
    root, env = checkout
    assert tool(root, env, "up").returncode == 0
    assert tool(root, env, "down").returncode == 0
    # a new client key the machine does not know: sshd answers, ssh is refused
    for name in ("id_ed25519", "id_ed25519.pub"):
        (root / ".sandbox/keys" / name).unlink()
    up = tool(root, env, "up")
    assert up.returncode != 0
    assert "ssh fails" in up.stderr and "Permission denied" in up.stderr, up.stderr
    assert "Traceback" not in up.stderr


def test_port_in_use_is_named(checkout):
    root, env = checkout
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # held while the tool runs: no other program can take it meanwhile
        s.listen()
        port = s.getsockname()[1]
        up = tool(root, {**env, "GLM_FLASH_SANDBOX_PORT": str(port)}, "up", timeout=60)
    assert up.returncode != 0
    assert f"127.0.0.1:{port} is already in use" in up.stderr, up.stderr
    assert "python" in up.stderr  # ss names the program holding the port
    assert "GLM_FLASH_SANDBOX_PORT" in up.stderr and "Traceback" not in up.stderr
    assert not (root / ".sandbox/rootfs").exists()  # refused before building anything


def test_nspawn_exit_is_reported_with_its_message(checkout):
    root, env = checkout
    (root / ".sandbox/rootfs").mkdir(parents=True)  # not an OS tree: nspawn refuses to boot it
    up = tool(root, env, "up", timeout=60)
    assert up.returncode != 0
    assert "systemd-nspawn exited with status" in up.stderr
    assert "doesn't look like an OS root directory" in up.stderr, up.stderr


def test_a_stranger_sshd_on_our_port_is_named(checkout, sandbox):
    """Another checkout's sshd (the suite's own sandbox here) answers on the port this checkout recorded:
    strict host-key checking against this checkout's own known_hosts refuses it, and `up` says so."""
    root, env = checkout
    theirs = ports(REPO)["ssh"]
    (root / ".sandbox").mkdir(parents=True)
    (root / ".sandbox/ports.json").write_text(json.dumps({"ssh": theirs, "standin": 1, "hub": 2}))
    # this checkout's machine "runs" (a process of our own stands in for its nspawn), so `up` keeps the port
    stand_in = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        (root / ".sandbox/nspawn.pid").write_text(str(stand_in.pid))
        up = tool(root, env, "up", timeout=60)
    finally:
        (root / ".sandbox/nspawn.pid").unlink(missing_ok=True)  # the teardown's destroy must not signal a reused pid
        stand_in.kill()
        stand_in.wait()
    assert up.returncode != 0
    assert f"the sshd answering on 127.0.0.1:{theirs} is not this checkout's sandbox" in up.stderr, up.stderr
    assert "Host key verification failed" in up.stderr and "Traceback" not in up.stderr
    assert subprocess.run(["ssh", "-F", str(REPO / ".sandbox/ssh_config"), "sandbox", "true"]).returncode == 0
