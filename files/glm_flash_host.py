"""What the host tools share: the host paths they agree on, a file's sha256, durable writes, the one way
an engine environment is built (uv), a systemd credential, a unit's properties and journal, the GPUs
on the PCI bus (stdlib only).

The deploy installs this file beside every tool of files/ it installs (roles/operations/uploads.py
host_tool: root:root 0644 in a root-owned 0755 directory), and a tool finds it as Python finds any
module beside a script: a script's own directory, symlinks resolved, is sys.path[0]. So nothing the
service user can write is on the path of a tool root runs. The paths are control/layout.py's
(tests/unit/test_root_state_paths.py keeps them equal); a tool may let its tests override one
through the environment, never more.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tempfile

CONF_DIR = "/etc/glm-flash"  # root-owned; the service user may read, never write
STATUS_FILE = f"{CONF_DIR}/status.json"
LAUNCH_SPEC = f"{CONF_DIR}/launch.json"
# Root's own state, outside the service user's home (layout.ROOT_STATE).
ROOT_STATE = "/var/lib/glm-flash-deploy"
PATCH_STATE = f"{ROOT_STATE}/patches"  # glm-flash-patch: manifests/, originals/
ENGINE_CHECKS = f"{ROOT_STATE}/engine-checks"  # glm-flash-engine status: owner checks of unchanged files
CUDA_RUNFILE_CACHE = "/var/cache/glm-flash/cuda"  # glm-flash-nvidia-repo: NVIDIA's runfile
CUDA_HEADER_LOG = "/var/log/glm-flash/cuda-header.log"  # the dpkg hook's runs of the header fix
NOTIFY_CONF = "/etc/glm-flash-notify/notify.json"
NOTIFY_STATE = "/var/lib/glm-flash-notify"  # the notifier's StateDirectory=


def root_dir() -> str:
    """The install root (e.g. /opt/glm-flash): two levels above the tools' directory, bin/, where this
    module is installed beside them; $GLM_FLASH_ROOT for tests."""
    return os.environ.get("GLM_FLASH_ROOT") or os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


# uv (locks/tools.txt), the one builder of the hosts' Python environments: no configuration file of
# the host read, no managed Python downloaded, nothing from a user site.
UV_ENV = {"UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "PYTHONNOUSERSITE": "1"}


def default_uv() -> str:
    """The uv the deploy installs (locks/tools.txt; roles/operations/python.py uv_installed): <root>/tools/uv."""
    return os.path.join(root_dir(), "tools", "uv")


def uv_venv(uv: str, python: str, env_dir: str) -> list[str]:
    """`uv venv` of `python` at env_dir; what is already there (a build's checkouts) is kept."""
    options = "--quiet --no-config --no-cache --no-python-downloads --allow-existing".split()
    return [uv, "venv", *options, "--python", python, env_dir]


def uv_install(uv: str, env_dir: str, cache: str, *args: str) -> list[str]:
    """`uv pip install` of what `args` name into env_dir, nothing beyond it (--no-deps), no configuration
    file, .pyc written (the service cannot write them: its tree is read-only). uv unpacks each wheel into
    `cache` (on the environment's filesystem, not /tmp, which a tmpfs may not hold: an engine's set
    unpacks to 7-12 GiB) and the environment's files are hard links to those: the set's size once on
    disk, not twice."""
    options = "--quiet --no-config --link-mode hardlink --compile-bytecode --no-deps".split()
    return [uv, "pip", "install", *options, "--cache-dir", cache, "--python", f"{env_dir}/bin/python", *args]


@contextlib.contextmanager
def install_cache(env_dir: str):
    """A uv cache of one install's own inside env_dir (on its filesystem), empty at the start (a killed
    install's removed) and removed after: nothing unpacked is shared with another environment or a
    later build, and each installed file keeps one link, the environment's."""
    cache = os.path.join(env_dir, ".glm-flash-uv-cache")
    shutil.rmtree(cache, ignore_errors=True)
    try:
        yield cache
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def sha256_file(file: str | int) -> str:
    """The hex sha256 of a file, by path or by an open descriptor (read from where it stands, left open)."""
    with open(file, "rb", closefd=not isinstance(file, int)) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_tree(top: str) -> None:
    """fsync every regular file and directory under `top` (links not followed): pip and tar write
    without it. Only this tree's data is waited for, not the whole machine's (sync)."""
    for d, _, files in os.walk(top):
        for name in files:
            try:
                fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue  # a link (its target is a file of this tree, synced by its own name)
            try:
                if stat.S_ISREG(os.fstat(fd).st_mode):
                    os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(d)


def write_durably(path: str, data: bytes | str, mode: int = 0o644, owner: tuple[int, int] | None = None) -> None:
    """Replace `path` with `data` whole or not at all, and durably: a dot-named temporary file beside it
    (owner and mode set on its descriptor), fsynced, renamed over `path`, the directory fsynced."""
    if isinstance(data, str):
        data = data.encode()
    d = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".glm-flash-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(d)


def credential(name: str, directory: str | None = None) -> str:
    """The text of file `name` in `directory` (default: the systemd credentials of the unit running
    this, $CREDENTIALS_DIRECTORY: LoadCredential=), stripped; "" when there is none."""
    directory = directory or os.environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return ""
    try:
        with open(os.path.join(directory, name)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def nvidia_pci_devices(root: str = "/sys/bus/pci/devices") -> int:
    """NVIDIA display/3D controllers on the PCI bus (class 0x03xxxx): what the box has, driver or not."""
    count = 0
    for dev in glob.glob(os.path.join(glob.escape(root), "*")):
        try:
            with open(os.path.join(dev, "vendor")) as vendor, open(os.path.join(dev, "class")) as cls:
                count += vendor.read().strip() == "0x10de" and cls.read().strip().startswith("0x03")
        except OSError:
            continue
    return count


def probe_address(listen: str) -> str:
    """Where to ask a server that listens on `listen`: loopback for a wildcard (or none), else that
    address; an IPv6 one in brackets, as a URL has it."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(listen, listen)
    return f"[{host}]" if ":" in host else host


def unit_properties(unit: str, props: str, timeout: float | None = None) -> dict[str, str]:
    """`systemctl show UNIT --property=PROPS` (names, comma-separated) as {name: value}."""
    r = subprocess.run(
        ["systemctl", "show", unit, f"--property={props}"], capture_output=True, text=True, check=False, timeout=timeout
    )
    return dict(line.partition("=")[::2] for line in r.stdout.splitlines())


def journal_entries(argv: list[str], timeout: float = 60) -> list[dict]:
    """The entries `journalctl ARGV -o json` prints, each a dict (lines that are not one are skipped)."""
    r = subprocess.run(
        ["journalctl", "--no-pager", "-q", "-o", "json", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
    out = []
    for line in r.stdout.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def journal_text(value) -> str:
    """A journal field as text: journalctl's JSON gives one that is not UTF-8 as a list of bytes."""
    if isinstance(value, list):
        return bytes(b & 0xFF for b in value if isinstance(b, int)).decode("utf-8", "replace")
    return value if isinstance(value, str) else ""
