"""A stand-in for NVIDIA's Debian 13 CUDA repository and its CUDA 12.8 runfile, for the sandbox.

Simulated, because NVIDIA's servers are unreachable here and the sandbox has no GPU. Shaped
from the public record (docs/sources.md §7): a flat repository (`Suites: /`) under
`.../repos/debian13/x86_64/` with `Packages`, `Release` and an `InRelease` signed by one key
published beside them as `<KEYID>.pub`; NVIDIA's package names (`nvidia-driver-cuda`,
`nvidia-kernel-open-dkms`, `nvidia-kernel-dkms`, `nvidia-persistenced`,
`nvidia-driver-pinning-<branch>`, `cuda-toolkit-X-Y`) for branches 590 and 595 and a
toolkit of CUDA 13.1 only (no 12.x, as in the real one). The key is a test key made here,
never NVIDIA's. The packages install files, not drivers. The runfile honours the real one's
`--silent --toolkit --toolkitpath=DIR` and installs a tree with the real CUDA 12.8
crt/math_functions.h (from PyPI's nvidia-cuda-nvcc-cu12 12.8.93) and an nvcc that prints its
version and compiles host code only (with the system's c++).

    python3 sandbox/nvidia_standin.py OUT_DIR [BRANCH=VERSION ...]
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

REPO_PATH = "compute/cuda/repos/debian13/x86_64"
RUNFILE_PATH = "compute/cuda/12.8.1/local_installers/cuda_12.8.1_570.124.06_linux.run"
# Versions are made up for the stand-in; only their branch (the first number) matters.
BRANCHES = {"590": "590.48.01-1", "595": "595.58.03-1"}
TOOLKITS = {"13-1": "13.1.1-1"}
DRIVER_PACKAGES = ("nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-kernel-dkms", "nvidia-persistenced")
HEADER_WHEEL = ("nvidia-cuda-nvcc-cu12", "12.8.93")
HEADER_IN_WHEEL = "nvidia/cuda_nvcc/include/crt/math_functions.h"
UID = "glm-flash stand-in repository key (TEST ONLY, not NVIDIA's) <standin@glm-flash.invalid>"


def gpg(home: Path, *args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(
        ["gpg", "--batch", "--no-tty", "--homedir", str(home), *args], input=data, capture_output=True, check=True
    ).stdout


def signing_key(home: Path) -> str:
    """The stand-in's key (made once, kept with the sandbox so re-signing uses the same key)."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    listing = gpg(home, "--with-colons", "--list-secret-keys").decode()
    if "sec:" not in listing:
        gpg(home, "--passphrase", "", "--quick-gen-key", UID, "ed25519", "sign", "never")
        listing = gpg(home, "--with-colons", "--list-secret-keys").decode()
    return next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))


def deb(
    out: Path,
    name: str,
    version: str,
    files: dict[str, bytes],
    description: str,
    links: dict[str, str] | None = None,
    source: str = "nvidia-standin",
) -> Path:
    """A .deb (built with dpkg-deb) that installs `files` and `links`, in `out`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / name
        (root / "DEBIAN").mkdir(parents=True)
        (root / "DEBIAN/control").write_text(
            f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nSource: {source}\n"
            f"Maintainer: glm-flash sandbox <root@localhost>\nSection: non-free/libs\nPriority: optional\n"
            f"Description: stand-in for {name} (TEST ONLY)\n {description}\n"
        )
        for path, data in files.items():
            f = root / path.lstrip("/")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(data)
        for path, target in (links or {}).items():
            (root / path.lstrip("/")).symlink_to(target)
        built = out / f"{name}_{version}_amd64.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(built)],
            check=True,
            capture_output=True,
        )
    return built


def pin(branch: str) -> bytes:
    return (
        f"# stand-in for NVIDIA's nvidia-driver-pinning-{branch} (TEST ONLY)\n"
        "Package: *nvidia* libcuda1 libnvcuvid1 libnvoptix1 cuda-drivers*\n"
        f"Pin: version /^([0-9]+:)?{branch}\\./\nPin-Priority: 1000\n"
    ).encode()


def packages(repo: Path, branches: dict[str, str]) -> None:
    for branch, version in branches.items():
        for name in DRIVER_PACKAGES:
            if not (repo / f"{name}_{version}_amd64.deb").exists():
                deb(
                    repo,
                    name,
                    version,
                    {f"/usr/share/doc/{name}/STANDIN": b"stand-in: files only, no driver\n"},
                    f"Branch {branch}; installs a note, no kernel module.",
                )
        pinning = f"nvidia-driver-pinning-{branch}"
        if not (repo / f"{pinning}_{version}_amd64.deb").exists():
            deb(
                repo,
                pinning,
                version,
                {f"/etc/apt/preferences.d/{pinning}": pin(branch)},
                f"Holds the driver on branch {branch}.",
            )
    for short, version in TOOLKITS.items():
        name = f"cuda-toolkit-{short}"
        if not (repo / f"{name}_{version}_amd64.deb").exists():
            deb(
                repo,
                name,
                version,
                {f"/usr/local/cuda-{short.replace('-', '.')}/version.json": b"{}\n"},
                "A toolkit version the repository carries.",
            )


def index(repo: Path, home: Path) -> None:
    """Packages, Release, InRelease and Release.gpg of a flat repository."""
    scan = subprocess.run(["dpkg-scanpackages", "--multiversion", "."], cwd=repo, capture_output=True, check=True)
    (repo / "Packages").write_bytes(scan.stdout)
    (repo / "Packages.gz").write_bytes(gzip.compress(scan.stdout, mtime=0))
    date = time.strftime("%a, %d %b %Y %H:%M:%S UTC", time.gmtime(time.time() - 3600))
    lines = [
        "Origin: glm-flash stand-in",
        "Label: stand-in for NVIDIA CUDA debian13",
        "Architectures: amd64",
        f"Date: {date}",
        "Acquire-By-Hash: no",
        "SHA256:",
    ]
    for name in ("Packages", "Packages.gz"):
        data = (repo / name).read_bytes()
        lines.append(f" {hashlib.sha256(data).hexdigest()} {len(data)} {name}")
    release = ("\n".join(lines) + "\n").encode()
    (repo / "Release").write_bytes(release)
    (repo / "InRelease").write_bytes(gpg(home, "--clearsign", "--digest-algo", "SHA512", data=release))
    (repo / "Release.gpg").write_bytes(gpg(home, "--armor", "--detach-sign", "--digest-algo", "SHA512", data=release))


def runfile(header: bytes) -> bytes:
    """A shell installer with a tar.gz payload, honouring the real runfile's toolkit options."""
    nvcc = (
        b"#!/bin/sh\n# stand-in nvcc (TEST ONLY): prints the version of CUDA 12.8.1's; given files, compiles\n"
        b"# their host code with the system's c++, as the real one hands host code to it (no device code)\n"
        b'case "${1:---version}" in --version|-V)\n'
        b"echo 'nvcc: NVIDIA (R) Cuda compiler driver'\n"
        b"echo 'Cuda compilation tools, release 12.8, V12.8.93'\n"
        b"exit 0 ;;\nesac\n"
        b'exec c++ -x c++ "$@"\n'
    )
    members = {
        "bin/nvcc": (nvcc, 0o755),
        "targets/x86_64-linux/include/crt/math_functions.h": (header, 0o644),
        "version.json": (json.dumps({"cuda": {"version": "12.8.1"}}).encode() + b"\n", 0o644),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.GNU_FORMAT) as t:
        for name, (data, mode) in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            t.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("include")
        link.type, link.linkname, link.mtime = tarfile.SYMTYPE, "targets/x86_64-linux/include", 0
        t.addfile(link)
    script = b"""#!/bin/sh
# Stand-in for NVIDIA's cuda_12.8.1_570.124.06_linux.run (TEST ONLY): toolkit options only.
silent= toolkit= path=/usr/local/cuda-12.8
for a in "$@"; do
  case "$a" in
    --silent) silent=1 ;;
    --toolkit) toolkit=1 ;;
    --toolkitpath=*) path="${a#*=}" ;;
    --no-man-page|--tmpdir=*) ;;
    --driver) echo "stand-in runfile: --driver is never wanted here" >&2; exit 9 ;;
    *) echo "stand-in runfile: unknown option $a" >&2; exit 1 ;;
  esac
done
if [ -z "$silent" ] || [ -z "$toolkit" ]; then echo "stand-in runfile: needs --silent --toolkit" >&2; exit 1; fi
mkdir -p "$path" || exit 1
skip=$(awk '/^__PAYLOAD_BELOW__$/ { print NR + 1; exit }' "$0")
tail -n +"$skip" "$0" | tar -xzf - -C "$path" || exit 1
echo "stand-in runfile: toolkit installed at $path" >> /var/log/cuda-installer.log
exit 0
__PAYLOAD_BELOW__
"""
    return script + buf.getvalue()


def header_12_8() -> bytes:
    from control.pypi_cache import wheel

    with zipfile.ZipFile(wheel(*HEADER_WHEEL, accept=("x86_64",))) as z:
        return z.read(HEADER_IN_WHEEL)


def build(out: Path, home: Path, branches: dict[str, str] | None = None) -> dict:
    """Build (or extend) the stand-in under out/; returns what an inventory needs to use it."""
    repo = out / REPO_PATH
    repo.mkdir(parents=True, exist_ok=True)
    fingerprint = signing_key(home)
    (repo / f"{fingerprint[-8:]}.pub").write_bytes(gpg(home, "--armor", "--export", fingerprint))
    packages(repo, branches or BRANCHES)
    index(repo, home)
    run = out / RUNFILE_PATH
    if not run.exists():
        run.parent.mkdir(parents=True, exist_ok=True)
        run.write_bytes(runfile(header_12_8()))
    info = {
        "fingerprint": fingerprint,
        "key_file": f"{REPO_PATH}/{fingerprint[-8:]}.pub",
        "repo_path": REPO_PATH,
        "runfile_path": RUNFILE_PATH,
        "runfile_sha256": hashlib.sha256(run.read_bytes()).hexdigest(),
    }
    (out / "standin.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


if __name__ == "__main__":
    if len(sys.argv) < 2 or not shutil.which("gpg") or not shutil.which("dpkg-scanpackages"):
        sys.exit(__doc__ + "\n(needs gpg and dpkg-dev: make deps)")
    extra = dict(arg.split("=", 1) for arg in sys.argv[2:])
    target = Path(sys.argv[1])
    print(json.dumps(build(target, Path(os.environ.get("GNUPGHOME", target / "gnupg")), extra or None), indent=1))
