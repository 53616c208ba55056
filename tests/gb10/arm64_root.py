"""A Debian 13 arm64 userland on this x86_64 machine: real aarch64 programs, run under qemu-user.

- `image()`: `mmdebstrap --architectures=arm64,amd64 --variant=minbase`: dpkg's architecture is
  arm64 and every program is Debian's arm64 build (python3 3.13, coreutils, util-linux, apt), except
  systemd and dbus, which are their amd64 builds of the same version (Multi-Arch: foreign, so
  they satisfy the arm64 packages' dependencies). Nothing for building environments (no ensurepip,
  no pip: the host's uv builds them, roles/operations/python.py). Built once (dpkg configures the
  packages emulated: minutes) into ${GLM_FLASH_CACHE}/sandbox/trixie-arm64-<key>.tar, beside the
  sandbox's own image; the key covers the mirror, the architectures and the packages.
- `unpacked(dest)`: that image unpacked (seconds), a root of its own for each test run.
- `run(root, command)`: `sh -c command` in the root, as root, with systemd-nspawn (its own /proc and
  /dev, the machine's network; nothing booted). Every aarch64 program runs through binfmt_misc's
  qemu-aarch64 entry, whose F flag makes the kernel open the emulator when the entry is registered,
  so the root needs no qemu of its own.
- `booted(root)`: the root booted (systemd-nspawn -b, the machine's network), for what runs as the
  deploy runs it, in a unit of systemd's; `Machine.sh(command)` runs a command inside it.
- `emulation()`: that entry is there and enabled: binfmt_misc mounted and the entry Debian's
  qemu-user-static registers with binfmt-support (`make deps` installs both; CI runs as root on a
  fresh machine, where the package's own registration may not have happened) enabled.

Why PID 1 is not emulated: systemd 257's arm64 build does not boot under qemu-user. With Debian
12's qemu 7.2 every unit fails to spawn ("Failed to spawn executor: Invalid argument", result
`resources`: systemd/systemd#31219, a limit of qemu-user), and with Debian 13's qemu 10.0 the
units spawn but journald, dbus and sshd exit during their setup. With an amd64 systemd the
services' own programs (python3, the downloader) still run as aarch64 code under qemu.

What differs from DGX OS (the GB10 box): Debian 13, not Ubuntu 24.04; python3 is 3.13, not 3.12;
glibc 2.41, not 2.39; PID 1 and dbus are amd64 builds; every arm64 program is emulated, not run by a
Cortex-X925. qemu's code generator needs memory that is written and then executed, so a booted
root has a drop-in for every service that turns MemoryDenyWriteExecute= off (the deploy's download
unit sets it on; on the box it stays on). The wheels a deploy sends are chosen from what the
userland's own python3 says of itself (the HostPython fact), so here they are cp313 aarch64 ones;
DGX OS's cp312 aarch64 choice is tests/unit/test_wheel_target.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from control.pypi_cache import cache_root  # noqa: E402
from sandbox.sandbox import nspawn  # noqa: E402

MIRROR = os.environ.get("GLM_FLASH_SANDBOX_MIRROR", "http://deb.debian.org/debian")  # as sandbox/sandbox.py
# What the downloader's test runs there: python3 (Debian's minbase brings sh, coreutils, useradd,
# setpriv). No sshd, sudo or iproute2 (the test enters the booted root with nsenter) and no CA
# bundle (the fake hub is plain HTTP on loopback): their maintainer scripts, emulated, took 144 s
# of the image's 315 s on the idle CI machine.
PACKAGES = ["python3"]
NATIVE = ["systemd:amd64", "systemd-sysv:amd64", "dbus:amd64"]  # PID 1 and the bus (see above)
ARCHITECTURES = "arm64,amd64"  # the first is dpkg's own
BINFMT = Path("/proc/sys/fs/binfmt_misc")
ENTRY = BINFMT / "qemu-aarch64"  # the name Debian's qemu-user-static gives it (mmdebstrap looks for it too)


class Unavailable(Exception):
    """aarch64 programs cannot run here; the message says why and what to do."""


def image() -> Path:
    key = hashlib.sha256(" ".join(["trixie", ARCHITECTURES, "minbase", MIRROR, *PACKAGES, *NATIVE]).encode())
    key = key.hexdigest()[:12]
    return cache_root() / "sandbox" / f"trixie-arm64-{key}.tar"


def emulation() -> None:
    """binfmt_misc mounted and its qemu-aarch64 entry enabled with the F flag, or Unavailable."""
    if os.geteuid() != 0:
        raise Unavailable("needs root (binfmt_misc, mmdebstrap and systemd-nspawn do); run the tests as root")
    if not (BINFMT / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], check=False, capture_output=True)
    if not ENTRY.exists() and shutil.which("update-binfmts"):
        subprocess.run(["update-binfmts", "--enable", "qemu-aarch64"], check=False, capture_output=True)
    lines = ENTRY.read_text().splitlines() if ENTRY.exists() else []
    flags = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("flags:")), "")
    if lines[:1] != ["enabled"] or "F" not in flags:
        raise Unavailable(
            f"binfmt_misc has no enabled qemu-aarch64 entry with the F flag ({' '.join(lines[:3]) or 'none'}); "
            "run `make deps` as root (qemu-user-static, binfmt-support), then the tests again"
        )


# dpkg configures every package under emulation, and python3.13's own scripts then byte-compile the
# whole standard library there (about 90 of the build's 355 s on the idle CI machine). While mmdebstrap
# installs, a stand-in takes the place of py_compile.py (a dpkg diversion, so the package's own file is
# put aside, not overwritten); after, the package's file is put back and the diversion removed. The
# root holds exactly Debian's files, without the .pyc a first import writes anyway.
PY_COMPILE = "/usr/lib/python3.13/py_compile.py"
_SKIP_COMPILE = (
    'mkdir -p "$1/usr/lib/python3.13" && '
    f'chroot "$1" dpkg-divert --quiet --local --divert {PY_COMPILE}.debian --add {PY_COMPILE} && '
    # py3compile pipes the file names in: read them all, compile nothing
    f"printf 'import sys\\nif \"-\" in sys.argv[1:]:\\n    sys.stdin.buffer.read()\\n' > \"$1{PY_COMPILE}\""
)
_PUT_BACK = f'rm "$1{PY_COMPILE}" && chroot "$1" dpkg-divert --quiet --local --rename --remove {PY_COMPILE}'


def build_image() -> Path:
    """The cached arm64 root (mmdebstrap, once)."""
    tar = image()
    if tar.exists():
        return tar
    emulation()
    if not shutil.which("mmdebstrap"):
        raise Unavailable("mmdebstrap is missing; run `make deps` as root")
    tar.parent.mkdir(parents=True, exist_ok=True)
    partial = tar.with_name(f".{tar.stem}.{os.getpid()}.tar")
    try:
        subprocess.run(
            ["mmdebstrap", "--mode=root", f"--architectures={ARCHITECTURES}", "--variant=minbase"]
            + ["--include=" + ",".join(PACKAGES + NATIVE)]
            + [f"--essential-hook={_SKIP_COMPILE}", f"--customize-hook={_PUT_BACK}"]
            + ["trixie", str(partial), f"deb {MIRROR} trixie main"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        partial.rename(tar)
    finally:
        partial.unlink(missing_ok=True)
    return tar


def unpacked(dest: Path) -> Path:
    tar = build_image()
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-xpf", str(tar), "-C", str(dest)], check=True)
    return dest


def run(root: Path, command: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """`sh -c command` inside `root` as root, its programs aarch64 under qemu."""
    setenv = [f"--setenv={k}={v}" for k, v in (env or {}).items()]
    return subprocess.run(
        ["systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--pipe", "-M", f"glm-flash-arm64-{os.getpid()}"]
        + ["-D", str(root), *setenv, "/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


class Machine:
    """A booted root: `sh` runs a command inside it (its namespaces, as root), not checked."""

    def __init__(self, leader: int):
        self.leader = leader

    def sh(self, command: str, timeout: int = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "/usr/bin/env", "-i", f"PATH={PATH}", "/bin/sh", "-c", command],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )


PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BOOT_S = 120
# qemu-user's code generator writes code, then runs it: MemoryDenyWriteExecute= would stop every
# emulated program (a drop-in for every service; on the box the deploy's setting stays)
QEMU_DROPIN = "etc/systemd/system/service.d/50-qemu-user.conf"


@contextlib.contextmanager
def booted(root: Path):
    """`root` booted with systemd-nspawn -b (the machine's network) until the block ends."""
    dropin = root / QEMU_DROPIN
    dropin.parent.mkdir(parents=True, exist_ok=True)
    dropin.write_text("# qemu-user (tests/gb10/arm64_root.py)\n[Service]\nMemoryDenyWriteExecute=no\n")
    log = root.parent / f"{root.name}.boot.log"
    # the sandbox's own boot (its nspawn flags), of this root
    proc = nspawn(root, f"glm-flash-arm64-{os.getpid()}", log, root.parent / f"{root.name}.pid")
    machine = None
    try:
        deadline, state = time.monotonic() + BOOT_S, ""
        while time.monotonic() < deadline and proc.poll() is None:
            children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            if children:
                machine = Machine(int(children[0]))
                state = machine.sh("systemctl is-system-running --wait", timeout=BOOT_S).stdout.strip()
                if state in ("running", "degraded"):
                    break
            time.sleep(0.5)
        else:
            raise Unavailable(f"the arm64 root did not boot in {BOOT_S} s (state {state!r}; log {log})")
        yield machine
    finally:
        if machine is not None:  # its PID 1: every process of the machine goes with it
            with contextlib.suppress(ProcessLookupError):
                os.kill(machine.leader, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
