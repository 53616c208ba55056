#!/usr/bin/env python3
"""A fleet sandbox: N Debian 13 machines booted with real systemd, one loopback address each.

    fleet.py up [-n N] [--from-sandbox]
                         boot N machines (default 3): node1 on 127.A.B.2, node2 on 127.A.B.3, ...
                         (127.A.B: this checkout's own, from its identity; see subnet())
                         --from-sandbox: on the single sandbox's snapshot instead of the bare image
    fleet.py down        power them off and delete what they wrote (the shared image stays)
    fleet.py status

The containers share the host's network (systemd-nspawn without a private network), so each
machine's sshd listens on its own loopback address, on this checkout's sandbox port (.sandbox/ports.json,
or GLM_FLASH_SANDBOX_PORT), and the machines are named after the checkout's identity
(glm-flash-fleet-<identity>-<n>): two checkouts' fleets boot side by side.
Nothing but 127.0.0.0/8 is used.

Disk: every machine is an overlay (overlayfs) whose read-only lower layer is ONE unpacked copy of
the cached pristine image (sandbox.py's, about 400 MB, kept in the cache beside the tarball), and
whose upper layer holds only what that machine writes (a few MB once booted). N machines cost
one image plus their own changes, not N images. With --from-sandbox the lower layer is the single
sandbox's snapshot (`make deploy`, then `sandbox.py snapshot`: its root kept read-only, which the
single sandbox itself then runs on too): N deployed workers for the disk of one, while the single
sandbox runs on beside them (it cannot be destroyed meanwhile: `fleet down` first).

The fleet's stand-ins are its own, on its subnet's first address: the hub (sandbox/fake_hub.py, the
single sandbox's staged checkpoint), logging to .sandbox/fleet/hub.log, so what the fleet downloads
is counted apart from what the single sandbox does; with --from-sandbox, the NVIDIA repository as
the snapshot holds it, so a test that tampers with the single sandbox's (a re-signed index, a new
branch) does not reach the fleet's deploys.

Simulated: the machines are containers on one kernel, not separate computers; they share the host
key of the single sandbox (.sandbox/keys), each known under its own address in
.sandbox/fleet/known_hosts. Everything else (systemd, sshd, apt, the file systems) is real.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sandbox as sb  # noqa: E402  (the single sandbox's image, keys and boot, reused)

FLEET = sb.STATE / "fleet"
KNOWN_HOSTS = FLEET / "known_hosts"
SSH_CONFIG = FLEET / "ssh_config"
NODES_FILE = FLEET / "nodes.json"  # what is up: read by inventory/fleet_sandbox.py and the tests
FROM_SANDBOX = FLEET / "from-sandbox"  # present while the fleet's lower layer is the single sandbox's snapshot
STANDINS = FLEET / "standins.json"  # {"hub": url, "nvidia": url}: the fleet's own, read by inventory/fleet_sandbox.py
HUB_LOG = FLEET / "hub.log"
HUB_PIDFILE, STANDIN_PIDFILE = FLEET / "hub.pid", FLEET / "standin.pid"
MAX_NODES = 16


def subnet(identity: str = "") -> str:
    """This checkout's own /24 inside 127.0.0.0/8 (all of it loopback on Linux), from its identity:
    two checkouts' fleets listen on different addresses, so no port of theirs meets (sshd, the
    engines, the gateway, the peer port 30080 of control/fleet.py). Never 127.0.0.x, the host's."""
    h = int((identity or sb.IDENTITY)[:8], 16)
    return f"127.{1 + h % 254}.{(h >> 8) % 256}"


def address(index: int) -> str:
    """node1 -> 127.A.B.2 (A.B this checkout's subnet())."""
    return f"{subnet()}.{index + 1}"


def node_dir(index: int) -> Path:
    return FLEET / f"node{index}"


def machine(index: int) -> str:
    return f"glm-flash-fleet-{sb.IDENTITY}-{index}"


def lower() -> Path:
    """The pristine image unpacked once, shared read-only by every fleet machine (and checkout)."""
    tar = sb.build_image()
    root = tar.with_suffix(".root")
    if root.exists():
        return root
    sb.say(f"unpacking the pristine image once into {root} (the fleet's shared lower layer)")
    tmp = tar.with_suffix(".root.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    sb.run(["tar", "-xpf", str(tar), "-C", str(tmp)])
    tmp.rename(root)
    return root


def mount(index: int, base: Path) -> Path:
    d = node_dir(index)
    root = d / "root"
    if sb.mounted(root):
        return root
    for sub in ("upper", "work", "root"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    sb.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir={base},upperdir={d / 'upper'},workdir={d / 'work'}",
            str(root),
        ]
    )
    return root


def personalize(index: int, root: Path) -> None:
    """What makes this machine itself: its name, its address, the sandbox's keys (written
    through the overlay, so into this machine's upper layer only)."""
    (root / "etc/hostname").write_text(f"node{index}\n")
    ssh = root / "root/.ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy(sb.KEYS / "id_ed25519.pub", ssh / "authorized_keys")
    os.chmod(ssh / "authorized_keys", 0o600)
    for old in (root / "etc/ssh").glob("ssh_host_*"):
        old.unlink()
    for suffix in ("", ".pub"):
        shutil.copy(sb.KEYS / f"ssh_host_ed25519_key{suffix}", root / f"etc/ssh/ssh_host_ed25519_key{suffix}")
    os.chmod(root / "etc/ssh/ssh_host_ed25519_key", 0o600)
    (root / "etc/ssh/sshd_config.d/sandbox.conf").write_text(
        f"# A fleet sandbox shares the host's network: sshd on this machine's own loopback address.\n"
        f"Port {sb.PORT}\nListenAddress {address(index)}\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
    )


def write_client_files(n: int) -> None:
    host_pub = " ".join((sb.KEYS / "ssh_host_ed25519_key.pub").read_text().split()[:2])
    KNOWN_HOSTS.write_text("".join(f"[{address(i)}]:{sb.PORT} {host_pub}\n" for i in range(1, n + 1)))
    SSH_CONFIG.write_text(
        "".join(
            f"Host node{i}\n  HostName {address(i)}\n  Port {sb.PORT}\n  User root\n"
            f"  IdentityFile {sb.KEYS / 'id_ed25519'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {KNOWN_HOSTS}\n  StrictHostKeyChecking yes\n"
            f"  ControlMaster auto\n  ControlPath {sb.control_dir()}/fleet-%C\n  ControlPersist 60s\n"
            for i in range(1, n + 1)
        )
    )
    NODES_FILE.write_text(
        json.dumps([{"name": f"node{i}", "address": address(i), "port": sb.PORT} for i in range(1, n + 1)], indent=2)
        + "\n"
    )


def ssh(index: int, command: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(SSH_CONFIG), f"node{index}", command], capture_output=True, text=True, timeout=timeout
    )


def pidfile(index: int) -> Path:
    return node_dir(index) / "nspawn.pid"


def boot(index: int, base: Path) -> subprocess.Popen | None:
    if sb.alive(pidfile(index)):
        return None
    if sb.port_open(sb.PORT, address(index)):
        who = sb.listener(sb.PORT)
        sys.exit(f"fleet: {address(index)}:{sb.PORT} is already in use{' by ' + who if who else ''}; run fleet down")
    root = mount(index, base)
    personalize(index, root)
    return sb.nspawn(root, machine(index), node_dir(index) / "boot.log", pidfile(index))


def wait_ready(index: int, proc: subprocess.Popen | None) -> None:
    deadline = time.time() + sb.BOOT_TIMEOUT
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            log = node_dir(index) / "boot.log"
            if "Too many open files" in log.read_text(errors="replace"):
                sys.exit(
                    f"fleet: node{index}'s systemd could not start: the host's inotify instances are used up "
                    f"(fs.inotify.max_user_instances = {inotify_limit()}, each booted machine takes about 7). "
                    "Fix: stop other containers, or raise it: sysctl fs.inotify.max_user_instances=512"
                )
            sys.exit(f"fleet: node{index}'s systemd-nspawn exited with status {proc.returncode}; see {log}")
        if sb.ssh_ready(address(index)):
            r = ssh(index, "systemctl is-system-running --wait >/dev/null 2>&1; true")
            if r.returncode == 0:
                return
        time.sleep(0.5)
    sys.exit(f"fleet: node{index} ({address(index)}:{sb.PORT}) did not answer SSH within {sb.BOOT_TIMEOUT} s")


def inotify_limit() -> str:
    return Path("/proc/sys/fs/inotify/max_user_instances").read_text().strip()


def nodes_up() -> list[int]:
    return sorted(int(p.name[4:]) for p in FLEET.glob("node*") if p.name[4:].isdigit() and sb.alive(p / "nspawn.pid"))


def up(n: int, from_sandbox: bool = False) -> None:
    if not 1 <= n <= MAX_NODES:
        sys.exit(f"fleet: N={n} is out of range; use 1 to {MAX_NODES}")
    if not shutil.which("systemd-nspawn"):
        sys.exit("fleet: systemd-nspawn is missing; run `make deps`")
    extra = [i for i in nodes_up() if i > n]
    if extra:
        sys.exit(f"fleet: {len(extra)} more machines are up than N={n}; run fleet down first")
    if any(node_dir(i).exists() for i in range(1, MAX_NODES + 1)) and FROM_SANDBOX.exists() != from_sandbox:
        sys.exit("fleet: the fleet is on another lower layer; run fleet down first")
    if from_sandbox and not (sb.SNAPSHOT / "etc/glm-flash").exists():
        sys.exit(
            "fleet: --from-sandbox needs a snapshot of the deployed single sandbox "
            "(make deploy, then sandbox.py snapshot): it is the fleet's read-only lower layer"
        )
    sb.settle_ports(running=sb.pid() is not None or bool(nodes_up()))
    sb.ensure_keys()
    FLEET.mkdir(parents=True, exist_ok=True)
    write_client_files(n)
    base = sb.SNAPSHOT if from_sandbox else lower()
    if from_sandbox:
        FROM_SANDBOX.touch()
    started = time.time()
    procs = {i: boot(i, base) for i in range(1, n + 1)}
    for i, proc in procs.items():
        wait_ready(i, proc)
    # the stand-ins the workers install from and download the checkpoint from (once: the seed)
    standins = {"hub": sb.hub_up(f"{subnet()}.1", HUB_LOG, HUB_PIDFILE)}
    if from_sandbox:
        standins["nvidia"] = sb.standin_up(
            f"{subnet()}.1", sb.SNAPSHOT / sb.STANDIN_WWW.relative_to(sb.ROOTFS), STANDIN_PIDFILE
        )
    STANDINS.write_text(json.dumps(standins) + "\n")
    sb.say(f"fleet of {n} up in {time.time() - started:.0f} s: ssh -F {SSH_CONFIG} node1 .. node{n}")


def down() -> None:
    for d in sorted(FLEET.glob("node*")):
        index = int(d.name[4:]) if d.name[4:].isdigit() else None
        if index is None:
            continue
        sb.poweroff(d / "nspawn.pid")
        root = d / "root"
        if sb.mounted(root):
            sb.run(["umount", str(root)])
        shutil.rmtree(d)
    for sock in sb.control_dir().glob("fleet-*"):
        sock.unlink(missing_ok=True)
    NODES_FILE.unlink(missing_ok=True)
    FROM_SANDBOX.unlink(missing_ok=True)
    for pidfile in (HUB_PIDFILE, STANDIN_PIDFILE):
        sb.stop_pidfile(pidfile)
    STANDINS.unlink(missing_ok=True)
    sb.say("fleet down and removed (the shared image stays in the cache)")


def status() -> None:
    for i in nodes_up():
        upper = subprocess.run(["du", "-sm", str(node_dir(i) / "upper")], capture_output=True, text=True)
        print(f"node{i} {address(i)}:{sb.PORT} up, own writes {upper.stdout.split()[0] if upper.stdout else '?'} MB")


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("fleet: run as root (systemd-nspawn and overlay mounts need it)")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("up", "down", "status"))
    ap.add_argument("-n", type=int, default=3, help="how many machines (up)")
    ap.add_argument("--from-sandbox", action="store_true", help="lower layer: the deployed single sandbox")
    args = ap.parse_args()
    sb.STATE.mkdir(exist_ok=True)
    {"up": lambda: up(args.n, args.from_sandbox), "down": down, "status": status}[args.action]()


if __name__ == "__main__":
    main()
