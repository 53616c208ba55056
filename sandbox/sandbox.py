#!/usr/bin/env python3
"""The built-in sandbox: a bare Debian 13 root filesystem booted with real systemd.

    sandbox.py up        build if needed, boot, wait until SSH answers
    sandbox.py down      power it off
    sandbox.py fresh     throw the machine away and boot a bare one
    sandbox.py destroy   power off and delete the machine (the cached image stays)
    sandbox.py snapshot  keep the machine as it is now; from then on it runs on that snapshot
    sandbox.py reset     back to the snapshot: what the machine wrote since is thrown away
    sandbox.py status
    sandbox.py ports     this checkout's machine name and ports (chosen now if not yet), as JSON

systemd-nspawn shares the host's network, so sshd listens on a loopback port. Keys
(client and host) live in .sandbox/keys and survive rebuilds, so host-key checks pass.
The pristine image is cached under $GLM_FLASH_CACHE (default ~/.cache/glm-flash).

A snapshot is the machine's root moved aside, unchanged (.sandbox/rootfs.lower), and the machine
booted from then on an overlay (overlayfs) of it, whose upper layer holds what it writes: `reset`
empties that layer, a deployed machine back in seconds instead of a fresh deploy. The fleet
sandbox (sandbox/fleet.py up --from-sandbox) boots its machines on the same snapshot, each with
an upper layer of its own, while this machine runs on.

Two checkouts on one machine boot side by side: the machine name carries a hash of the
checkout's real path (glm-flash-sandbox-<identity>), and `up` chooses the ports (sshd, the
stand-in repository, the stand-in hub, the engine, the node exporter, and the Prometheus and
webhook listeners of the tests) among those free on 127.0.0.1, starting at a place derived from
the same hash, and records them in .sandbox/ports.json, which the inventories, the fleet sandbox,
the tests and the ssh_config read. The variables of PORT_ENV (GLM_FLASH_SANDBOX_PORT,
GLM_FLASH_STANDIN_PORT, GLM_FLASH_HUB_PORT, ...) pin them instead. sshd inside the machine must be given a number (it cannot
take our socket), so a port can still be taken between the choice and sshd's bind: ssh's
strict host-key check against our own known_hosts then refuses the stranger, and `up` says so.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATE = REPO / ".sandbox"
ROOTFS = STATE / "rootfs"
KEYS = STATE / "keys"
PIDFILE = STATE / "nspawn.pid"
SNAPSHOT = STATE / "rootfs.lower"  # `snapshot`: the machine as it was, read-only from then on
UPPER, WORK = STATE / "rootfs.upper", STATE / "rootfs.work"  # what it wrote since, overlayfs's work dir
# One identity per checkout (its real path): two checkouts' machines and ports never meet.
IDENTITY = hashlib.sha256(str(REPO).encode()).hexdigest()[:10]
MACHINE = f"glm-flash-sandbox-{IDENTITY}"
PORTS_FILE = STATE / "ports.json"  # {"ssh": .., "standin": .., "hub": .., ...}, chosen by `up`
# The machine shares this one's network, so every port something listens on in it, or a test beside
# it, is chosen per checkout: sshd, the stand-in repository and hub; the engine's port and the node
# exporter's (inventory/sandbox.py gives them to the deploy); Prometheus and a webhook listener that
# tests run in it (tests/sandbox/test_prometheus_scrape.py).
PORT_ENV = {
    "ssh": "GLM_FLASH_SANDBOX_PORT",
    "standin": "GLM_FLASH_STANDIN_PORT",
    "hub": "GLM_FLASH_HUB_PORT",
    "engine": "GLM_FLASH_SANDBOX_ENGINE_PORT",
    "node_exporter": "GLM_FLASH_SANDBOX_NODE_EXPORTER_PORT",
    "prometheus": "GLM_FLASH_SANDBOX_PROMETHEUS_PORT",
    "webhook": "GLM_FLASH_SANDBOX_WEBHOOK_PORT",
    # The fleet gateway's router, on 127.0.0.1 (inventory/fleet_sandbox.py): loopback is shared too.
    "gateway_router": "GLM_FLASH_SANDBOX_ROUTER_PORT",
}
# Where the choice looks: below Linux's ephemeral range (32768-60999), so an outgoing connection's
# own port never takes a sandbox's; the start in it is derived from the identity.
PORT_RANGE = range(20000, 32000)
# Inside the machine (its key is also read there, as file:///srv/glm-flash-standin/...).
STANDIN_WWW = ROOTFS / "srv" / "glm-flash-standin"
STANDIN_PIDFILE = STATE / "standin.pid"
# The stand-in hub (sandbox/fake_hub.py) serving a small checkpoint with the real config.json
# keys (sandbox/fake_model.py), also on loopback: the deploy downloads it as from the real hub.
HUB_DIR = STATE / "hub"
HUB_INFO = HUB_DIR / "hub.json"
HUB_LOG = STATE / "hub.log"  # one JSON line per request the hub answered
HUB_PIDFILE = STATE / "hub.pid"
HUB_REPO = "zai-org/GLM-5.3-Flash"
TINY_REPO = "glm-flash-sandbox/tiny-llama"  # sandbox/tiny_model.py's model, which the CPU engine serves


def pinned_ports(env: dict | None = None) -> dict[str, int]:
    """The ports the environment pins (the stand-in's defaults follow a pinned sshd port, as before)."""
    env = os.environ if env is None else env
    found = {key: int(env[name]) for key, name in PORT_ENV.items() if env.get(name)}
    if "ssh" in found:
        found.setdefault("standin", found["ssh"] + 6000)
    if "standin" in found:
        found.setdefault("hub", found["standin"] + 1000)
    return found


def recorded_ports() -> dict[str, int]:
    try:
        return {k: int(v) for k, v in json.loads(PORTS_FILE.read_text()).items() if k in PORT_ENV}
    except (FileNotFoundError, ValueError, AttributeError):
        return {}


def current_ports() -> dict[str, int]:
    """What this checkout uses now: the environment's pins over what `up` recorded (0: not chosen yet)."""
    return {key: 0 for key in PORT_ENV} | recorded_ports() | pinned_ports()


def bindable(port: int, address: str = "127.0.0.1") -> bool:
    """Nothing holds `port` on `address` (nor on the wildcard address): a bind without SO_REUSEADDR succeeds."""
    with socket.socket() as s:
        try:
            s.bind((address, port))
        except OSError:
            return False
    return True


def pick_ports(keys: list[str], avoid: set[int], identity: str = "") -> dict[str, int]:
    """One free port per key, none in `avoid`, searched from a start derived from `identity`."""
    span = len(PORT_RANGE)
    start = int(hashlib.sha256((identity or IDENTITY).encode()).hexdigest(), 16) % span
    chosen: dict[str, int] = {}
    for step in range(span):
        if len(chosen) == len(keys):
            break
        port = PORT_RANGE[(start + step) % span]
        if port not in avoid and port not in chosen.values() and bindable(port):
            chosen[keys[len(chosen)]] = port
    if len(chosen) < len(keys):
        sys.exit(f"sandbox: no free port on 127.0.0.1 in {PORT_RANGE.start}-{PORT_RANGE.stop - 1}")
    return chosen


def settle_ports(running: bool = False) -> dict[str, int]:
    """Choose the ports not pinned nor recorded (and, while nothing of ours runs, the recorded ones that
    another program took since), record them in .sandbox/ports.json and use them from now on."""
    global PORT, STANDIN_PORT, HUB_PORT
    pinned, recorded = pinned_ports(), recorded_ports()
    keep = dict(recorded)
    if not running:
        keep = {k: v for k, v in recorded.items() if bindable(v) or k in pinned}
        for key in sorted(set(recorded) - set(keep)):
            say(f"127.0.0.1:{recorded[key]} (this checkout's {key} port) is taken now; choosing another")
    ports = keep | pinned
    missing = [key for key in PORT_ENV if key not in ports]
    if missing:
        ports |= pick_ports(missing, set(ports.values()))
    STATE.mkdir(exist_ok=True)
    if ports != recorded:
        PORTS_FILE.write_text(json.dumps({k: ports[k] for k in PORT_ENV}) + "\n")
    PORT, STANDIN_PORT, HUB_PORT = ports["ssh"], ports["standin"], ports["hub"]
    return ports


_ports = current_ports()
PORT, STANDIN_PORT, HUB_PORT = _ports["ssh"], _ports["standin"], _ports["hub"]
CACHE = Path(os.environ.get("GLM_FLASH_CACHE", Path.home() / ".cache" / "glm-flash"))
MIRROR = os.environ.get("GLM_FLASH_SANDBOX_MIRROR", "http://deb.debian.org/debian")
# A bare server: systemd, sshd, sudo and nothing the deploy is supposed to install.
PACKAGES = ["systemd", "systemd-sysv", "dbus", "openssh-server", "ca-certificates", "iproute2", "sudo"]
# The user Debian 13's installer creates when root is given no password (DGX OS's first boot the
# same): in group sudo, with a password; root's password field stays '*' (no password login), and
# sshd keeps Debian's default PermitRootLogin prohibit-password. The deploy logs in as this user
# with pyinfra's _sudo (inventory/sandbox.py). Root's key login stays for the tests' own ssh.
USER = "glm"
# The README's one-time step on a real box (`ssh -t glm@gpu1.lan ... sudo tee`, typing the password):
# passwordless sudo for the deploy user, so no password ever travels on a command line.
SUDOERS = "/etc/sudoers.d/glm-flash"


def say(msg: str) -> None:
    print(f"sandbox: {msg}", flush=True)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def image() -> Path:
    key = hashlib.sha256(" ".join(["trixie", MIRROR, *PACKAGES]).encode()).hexdigest()[:12]
    return CACHE / "sandbox" / f"trixie-{key}.tar"


def build_image() -> Path:
    """The cached image, built once. Several machines may be coming up at once (the session's
    sandbox, the GB10 sandbox, another checkout's, the test runs beside each other): the first
    builds it under a lock on the cache, the others wait there and then find it."""
    tar = image()
    if tar.exists():
        return tar
    if not shutil.which("mmdebstrap"):
        sys.exit("sandbox: mmdebstrap is missing; run `make deps` (apt-get install mmdebstrap systemd-container)")
    tar.parent.mkdir(parents=True, exist_ok=True)
    with open(tar.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tar.exists():
            _mmdebstrap(tar)
    return tar


def _mmdebstrap(tar: Path) -> None:
    say(f"building a Debian 13 image with mmdebstrap into {tar}")
    tmp = tar.with_suffix(".partial.tar")
    run(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            "--include=" + ",".join(PACKAGES),
            "trixie",
            str(tmp),
            f"deb {MIRROR} trixie main",
        ],
        stdout=subprocess.DEVNULL,
    )
    tmp.rename(tar)


def control_dir() -> Path:
    """Where ssh keeps its master sockets and gpg its agent's. A Unix socket's path must be
    shorter than 108 bytes (ssh refuses a ControlPath of 104 or more), so they cannot live under
    a checkout of any length: a short private directory per checkout instead."""
    tag = hashlib.sha256(str(STATE).encode()).hexdigest()[:10]
    path = Path(tempfile.gettempdir()) / f"glm-flash-ssh-{os.getuid()}-{tag}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        sys.exit(
            f"sandbox: {path} is not a directory private to this user (a link, someone else's, or "
            f"group/world-accessible); remove it and run again"
        )
    return path


def ensure_keys() -> None:
    KEYS.mkdir(parents=True, exist_ok=True)
    for name in ("id_ed25519", "ssh_host_ed25519_key"):
        if not (KEYS / name).exists():
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"glm-flash-{name}", "-f", str(KEYS / name)])
    host_pub = (KEYS / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    (STATE / "known_hosts").write_text(f"[127.0.0.1]:{PORT} {' '.join(host_pub)}\n")
    (STATE / "ssh_config").write_text(
        f"Host sandbox\n  HostName 127.0.0.1\n  Port {PORT}\n  User root\n"
        f"  IdentityFile {KEYS / 'id_ed25519'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {STATE / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
        f"  ControlMaster auto\n  ControlPath {control_dir()}/cm-%C\n  ControlPersist 60s\n"
    )


def unpacked(tmp: Path, hostname: str, keys: Path) -> Path:
    """The cached bare image unpacked into `tmp` (made anew), named `hostname`, root's SSH login
    and the host key taken from `keys` (this machine's own, so known_hosts stays true)."""
    tar = build_image()
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    run(["tar", "-xpf", str(tar), "-C", str(tmp)])
    (tmp / "etc/hostname").write_text(f"{hostname}\n")
    # As Debian's installer writes it: the host's own name resolves (sudo says so on every call otherwise).
    hosts = tmp / "etc/hosts"
    hosts.write_text(f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    ssh = tmp / "root/.ssh"
    ssh.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copy(keys / "id_ed25519.pub", ssh / "authorized_keys")
    os.chmod(ssh / "authorized_keys", 0o600)
    add_sudo_user(tmp, keys)
    for old in (tmp / "etc/ssh").glob("ssh_host_*"):
        old.unlink()
    for suffix in ("", ".pub"):
        shutil.copy(keys / f"ssh_host_ed25519_key{suffix}", tmp / f"etc/ssh/ssh_host_ed25519_key{suffix}")
    os.chmod(tmp / "etc/ssh/ssh_host_ed25519_key", 0o600)
    return tmp


def add_sudo_user(root: Path, keys: Path) -> None:
    """USER as Debian 13's installer leaves it (see USER), with our key and the README's sudo rule."""
    run(["useradd", "--root", str(root), "--create-home", "--shell", "/bin/bash", "--groups", "sudo", USER])
    secret = keys / f"{USER}-password"  # the user's login password, only ever read by us (0600)
    if not secret.exists():
        secret.write_text(os.urandom(18).hex() + "\n")
        secret.chmod(0o600)
    # chpasswd hashes through PAM, which fails in a chroot: hash here (openssl reads the password on
    # stdin) and give chpasswd the hash (-e), as the installer's shadow entry is one.
    hashed = run(
        ["openssl", "passwd", "-6", "-stdin"], input=secret.read_text().strip(), text=True, capture_output=True
    )
    run(["chpasswd", "-e", "--root", str(root)], input=f"{USER}:{hashed.stdout.strip()}\n", text=True)
    entry = next(
        line.split(":") for line in (root / "etc/passwd").read_text().splitlines() if line.startswith(USER + ":")
    )
    uid, gid, home = int(entry[2]), int(entry[3]), root / entry[5].lstrip("/")
    ssh = home / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    shutil.copy(keys / "id_ed25519.pub", ssh / "authorized_keys")
    os.chmod(ssh / "authorized_keys", 0o600)
    for path in (ssh, ssh / "authorized_keys"):
        os.chown(path, uid, gid)
    rule = root / SUDOERS.lstrip("/")
    rule.write_text(f"{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    rule.chmod(0o440)


def create_rootfs() -> None:
    say("unpacking a bare machine")
    tmp = unpacked(STATE / "rootfs.partial", "sandbox", KEYS)
    write_sshd_port(tmp)
    tmp.rename(ROOTFS)
    stage_nvidia()
    stage_hub()


def write_sshd_port(root: Path) -> None:
    """sshd's port and address (written at every boot: `up` may have chosen another port since).
    A root without sshd's configuration directory is not one of ours: nspawn says why when it boots."""
    if not (root / "etc/ssh/sshd_config.d").is_dir():
        return
    (root / "etc/ssh/sshd_config.d/sandbox.conf").write_text(
        f"# The sandbox shares the host's network: keep sshd on a loopback port (.sandbox/ports.json).\n"
        f"Port {PORT}\nListenAddress 127.0.0.1\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
    )


def stage_hub() -> None:
    """Simulated: the 306 GiB checkpoint cannot be fetched here, so the stand-in hub serves a
    small one with the real config.json keys (and tiny shards) under the real repo id; its
    commit is a hash of the files, so a changed stand-in is a new commit."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tiny_model
    from fake_model import write_model

    shutil.rmtree(HUB_DIR, ignore_errors=True)
    commits = {}
    for name, files in (("repo", write_model(HUB_DIR / "repo")), ("tiny", tiny_model.write(HUB_DIR / "tiny"))):
        digest = hashlib.sha1()
        for f in sorted(files.rglob("*")):
            if f.is_file():
                digest.update(f.relative_to(files).as_posix().encode() + b"\0" + f.read_bytes())
        commits[name] = digest.hexdigest()
    info = {"repo": HUB_REPO, "commit": commits["repo"], "port": HUB_PORT}
    info["tiny"] = {"repo": TINY_REPO, "commit": commits["tiny"]}
    HUB_INFO.write_text(json.dumps(info) + "\n")


def stage_nvidia() -> None:
    """Simulated: NVIDIA's debian13 repository and CUDA runfile cannot be reached here, so a
    stand-in shaped like them (sandbox/nvidia_standin.py) is built for this machine and
    served on loopback while it runs; inventory/sandbox.py points the deploy at it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from nvidia_standin import build

    shutil.rmtree(STANDIN_WWW, ignore_errors=True)
    build(STANDIN_WWW, control_dir() / "gnupg")


def alive(pidfile: Path) -> int | None:
    try:
        value = int(pidfile.read_text())
        os.kill(value, 0)
        return value
    except (FileNotFoundError, ValueError, ProcessLookupError):
        return None


def background(what: str, address: str, port: int, cmd: list[str], pidfile: Path, variable: str) -> str:
    """`cmd` started in the background (its pid in `pidfile`, its output beside it, .out) to serve
    `what` on address:port, unless it serves there already; its URL. `variable`: what pins the port."""
    url = f"http://{address}:{port}"
    if alive(pidfile) and port_open(port, address):
        return url
    stop_pidfile(pidfile)
    if port_open(port, address):
        who = listener(port)
        sys.exit(
            f"sandbox: {address}:{port} ({what}'s port) is already in use{' by ' + who if who else ''}; "
            f"stop that program or set {variable}"
        )
    out = pidfile.with_suffix(".out")
    with open(out, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    for _ in range(40):
        if proc.poll() is not None:
            break
        if port_open(port, address):
            return url
        time.sleep(0.25)
    sys.exit(f"sandbox: {what} did not start on {address}:{port} (exit {proc.poll()}); see {out}")


def standin_up(address: str = "127.0.0.1", www: Path = STANDIN_WWW, pidfile: Path = STANDIN_PIDFILE) -> str:
    """The stand-in NVIDIA repository, `www` served on `address` (the fleet sandbox serves its own,
    from the snapshot, on its subnet) at this checkout's stand-in port; its URL."""
    if www == STANDIN_WWW and not (www / "standin.json").exists():
        stage_nvidia()
    cmd = [sys.executable, "-m", "http.server", "--bind", address, "--directory", str(www), str(STANDIN_PORT)]
    return background("the stand-in NVIDIA repository", address, STANDIN_PORT, cmd, pidfile, "GLM_FLASH_STANDIN_PORT")


def hub_up(address: str = "127.0.0.1", log: Path = HUB_LOG, pidfile: Path = HUB_PIDFILE) -> str:
    """The stand-in hub on `address` (a loopback address: the fleet sandbox runs one of its own on its
    subnet, logging to its own file) at this checkout's hub port; its URL."""
    if not HUB_INFO.exists() or "tiny" not in json.loads(HUB_INFO.read_text()):
        stage_hub()
    info = json.loads(HUB_INFO.read_text())
    if info.get("port") != HUB_PORT:  # the inventories read the hub's address from here
        info["port"] = HUB_PORT
        HUB_INFO.write_text(json.dumps(info) + "\n")
    cmd = [sys.executable, str(Path(__file__).resolve().parent / "fake_hub.py"), "--repo", info["repo"]]
    cmd += ["--dir", str(HUB_DIR / "repo"), "--address", address, "--port", str(HUB_PORT), "--log", str(log)]
    cmd += ["--commit", info["commit"], "--also", info["tiny"]["repo"], str(HUB_DIR / "tiny"), info["tiny"]["commit"]]
    return background("the stand-in hub", address, HUB_PORT, cmd, pidfile, "GLM_FLASH_HUB_PORT")


def stop_pidfile(pidfile: Path) -> None:
    value = alive(pidfile)
    if value:
        os.killpg(value, signal.SIGTERM)
        for _ in range(40):
            if not alive(pidfile):
                break
            time.sleep(0.1)
    pidfile.unlink(missing_ok=True)


def pid() -> int | None:
    return alive(PIDFILE)


def port_open(port: int | None = None, address: str = "127.0.0.1") -> bool:
    """Something accepts connections on a loopback port (the sandbox's by default)."""
    port = PORT if port is None else port
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def ssh_ready(address: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((address, PORT), timeout=1) as s:
            return s.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def ssh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(STATE / "ssh_config"), "sandbox", command], capture_output=True, text=True, timeout=60
    )


def listener(port: int | None = None) -> str:
    """Who listens on a port, as `ss` tells it (empty when it cannot)."""
    port = PORT if port is None else port
    r = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True)
    return " ".join(r.stdout.split()) if r.returncode == 0 else ""


def log_since(offset: int, lines: int = 15) -> str:
    """The last lines this boot wrote to boot.log (nspawn's own messages among them)."""
    with open(STATE / "boot.log", "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    tail = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join("    " + line for line in tail) or "    (nothing)"


def first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines[-3:]) if lines else "(no message)"


def nspawn(root: Path, machine: str, logfile: Path, pidfile: Path) -> subprocess.Popen:
    """Boot `root` with its own systemd in the background (shared network); its pid in `pidfile`."""
    inotify_room()
    log = open(logfile, "ab")
    env = dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1")
    proc = subprocess.Popen(
        [
            "systemd-nspawn",
            "-b",
            "-D",
            str(root),
            "-M",
            machine,
            "--register=no",
            "--keep-unit",
            "--console=passive",
            "--resolv-conf=copy-host",
            # nspawn's own syscall allow-list refuses pidfd_getfd, which a real box allows and the
            # engine unit's filter allows for PyTorch's CUDA IPC (glm-flash-gpu-check's syscalls part)
            "--system-call-filter=pidfd_getfd",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=env,
        start_new_session=True,
    )
    pidfile.write_text(str(proc.pid))
    return proc


BOOT_TIMEOUT = 90
# Once sshd answers, ssh failing this long is a real failure (a key, a socket path), not a slow boot.
SSH_FAIL_GRACE = 5


INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")
# Every booted machine's systemd holds dozens of inotify instances, all counted against root on
# this machine; Debian's default of 128 lets about three boot ("Too many open files" from PID 1).
INOTIFY_NEEDED = 1024


def inotify_room() -> None:
    try:
        have = int(INOTIFY_INSTANCES.read_text())
    except (OSError, ValueError):
        return
    if have < INOTIFY_NEEDED:
        say(
            f"raising fs.inotify.max_user_instances from {have} to {INOTIFY_NEEDED} (each machine's systemd needs its own)"
        )
        INOTIFY_INSTANCES.write_text(f"{INOTIFY_NEEDED}\n")


def stranger(r: subprocess.CompletedProcess) -> bool:
    """ssh refused the host key: the sshd answering is not this checkout's machine."""
    return r.returncode != 0 and (
        "Host key verification failed" in r.stderr or "IDENTIFICATION HAS CHANGED" in r.stderr
    )


def stranger_message(r: subprocess.CompletedProcess) -> str:
    who = listener()
    return (
        f"sandbox: the sshd answering on 127.0.0.1:{PORT} is not this checkout's sandbox (its host key is not "
        f"the one in {STATE / 'known_hosts'}){': ' + who if who else ''}; another program took the port after it "
        f"was chosen. Run `sandbox.py down`, then `sandbox.py up` (it chooses a free port), or pin one with "
        f"GLM_FLASH_SANDBOX_PORT. ssh said: {first_line(r.stderr)}"
    )


def up() -> None:
    settle_ports(running=pid() is not None)
    ensure_keys()
    if pid() and ssh_ready():
        r = ssh("true")
        if stranger(r):  # something else answers on our port (our machine is not what listens there)
            sys.exit(stranger_message(r))
        standin_up()
        hub_up()
        say(f"already running (ssh -F {STATE / 'ssh_config'} sandbox)")
        return
    if pid():
        down()
    if port_open():
        who = listener()
        sys.exit(
            f"sandbox: 127.0.0.1:{PORT} is already in use{' by ' + who if who else ''}; stop that program "
            f"or pick another port with GLM_FLASH_SANDBOX_PORT"
        )
    if not shutil.which("systemd-nspawn"):
        sys.exit("sandbox: systemd-nspawn is missing; run `make deps`")
    overlay()
    if not ROOTFS.exists():
        create_rootfs()
    write_sshd_port(ROOTFS)
    say(f"booting {MACHINE} with systemd-nspawn (sshd on 127.0.0.1:{PORT}, ports in {PORTS_FILE})")
    logfile = STATE / "boot.log"
    offset = logfile.stat().st_size if logfile.exists() else 0
    proc = nspawn(ROOTFS, MACHINE, logfile, PIDFILE)
    deadline = time.time() + BOOT_TIMEOUT
    failing_since, last_error = None, ""
    while time.time() < deadline:
        if proc.poll() is not None:
            PIDFILE.unlink(missing_ok=True)
            sys.exit(
                f"sandbox: systemd-nspawn exited with status {proc.returncode} before SSH answered; "
                f"its last lines ({logfile}):\n{log_since(offset)}"
            )
        if ssh_ready():
            r = ssh("systemctl is-system-running --wait >/dev/null 2>&1; true")
            if r.returncode == 0:
                standin_up()
                hub_up()
                say(f"up: ssh -F {STATE / 'ssh_config'} sandbox")
                return
            last_error = first_line(r.stderr)
            failing_since = failing_since or time.time()
            if stranger(r):
                down()
                sys.exit(stranger_message(r))
            if time.time() - failing_since >= SSH_FAIL_GRACE:
                down()
                sys.exit(f"sandbox: sshd answers on 127.0.0.1:{PORT} but ssh fails (exit {r.returncode}): {last_error}")
        time.sleep(0.5)
    down()
    why = (
        f"ssh said: {last_error}"
        if last_error
        else f"nothing answered SSH on 127.0.0.1:{PORT}; the container's last lines ({logfile}):\n{log_since(offset)}"
    )
    sys.exit(f"sandbox: SSH did not answer within {BOOT_TIMEOUT} s; {why}")


def poweroff(pidfile: Path) -> bool:
    """Power off the machine booted with this pidfile; False when it was not running."""
    value = alive(pidfile)
    if value is None:
        pidfile.unlink(missing_ok=True)
        return False
    os.kill(value, signal.SIGTERM)  # nspawn asks the container's systemd to power off
    for _ in range(120):
        if alive(pidfile) is None:
            break
        time.sleep(0.25)
    else:
        os.killpg(value, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    return True


def down() -> None:
    stop_pidfile(STANDIN_PIDFILE)
    stop_pidfile(HUB_PIDFILE)
    if not poweroff(PIDFILE):
        say("not running")
        return
    for sock in control_dir().glob("cm-*"):
        sock.unlink(missing_ok=True)
    say("down")


def destroy() -> None:
    if (STATE / "fleet" / "from-sandbox").exists():  # sandbox/fleet.py FROM_SANDBOX
        sys.exit(
            "sandbox: the fleet sandbox's machines run on this machine's snapshot; run `sandbox/fleet.py down` first"
        )
    down()
    if mounted(ROOTFS):
        run(["umount", str(ROOTFS)])
    for path in (ROOTFS, UPPER, WORK, SNAPSHOT):
        shutil.rmtree(path, ignore_errors=True)
    shutil.rmtree(HUB_DIR, ignore_errors=True)
    HUB_LOG.unlink(missing_ok=True)
    say("machine deleted")


def mounted(path: Path) -> bool:
    return subprocess.run(["mountpoint", "-q", str(path)]).returncode == 0


def overlay() -> None:
    """With a snapshot: ROOTFS is the overlay of it and of what the machine wrote since (mounted now if
    it is not: after this machine's reboot, or a reset)."""
    if not SNAPSHOT.exists() or mounted(ROOTFS):
        return
    for path in (ROOTFS, UPPER, WORK):
        path.mkdir(exist_ok=True)
    # redirect_dir=on: a directory of the snapshot renamed inside the machine is a redirect in the
    # upper layer, not a copy of everything under it (tests/sandbox/test_uninstall.py moves the
    # 16 GB of engine environments aside and back; without it `mv` copies them)
    options = f"lowerdir={SNAPSHOT},upperdir={UPPER},workdir={WORK},redirect_dir=on"
    run(["mount", "-t", "overlay", "overlay", "-o", options, str(ROOTFS)])


def snapshot() -> None:
    if SNAPSHOT.exists():
        sys.exit(
            "sandbox: the machine already runs on a snapshot; `sandbox.py reset` goes back to it, `fresh` starts over"
        )
    if not ROOTFS.exists():
        sys.exit("sandbox: there is no machine to keep; run `sandbox.py up` (and a deploy) first")
    running = pid() is not None
    down()
    ROOTFS.rename(SNAPSHOT)
    overlay()
    say(f"snapshot kept in {SNAPSHOT}")
    if running:
        up()


def reset() -> None:
    if not SNAPSHOT.exists():
        sys.exit("sandbox: there is no snapshot to go back to; `sandbox.py snapshot` keeps one")
    running = pid() is not None
    down()
    if mounted(ROOTFS):
        run(["umount", str(ROOTFS)])
    for path in (UPPER, WORK):
        shutil.rmtree(path, ignore_errors=True)
    overlay()
    say("back to the snapshot")
    if running:
        up()


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("sandbox: run as root (mmdebstrap and systemd-nspawn need it)")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "action", choices=("up", "down", "fresh", "destroy", "snapshot", "reset", "status", "image", "ports")
    )
    action = ap.parse_args().action
    STATE.mkdir(exist_ok=True)
    if action == "up":
        up()
    elif action == "down":
        down()
    elif action == "fresh":
        destroy()
        up()
    elif action == "destroy":
        destroy()
    elif action == "snapshot":
        snapshot()
    elif action == "reset":
        reset()
    elif action == "image":
        print(build_image())
    elif action == "ports":
        print(json.dumps({"machine": MACHINE, **settle_ports(running=pid() is not None)}))
    else:
        print("running" if pid() and PORT and ssh_ready() else "stopped")


if __name__ == "__main__":
    main()
