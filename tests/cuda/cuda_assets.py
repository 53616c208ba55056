"""Download pinned wheels and build a Debian rootfs tarball, cached outside the clone.

Everything lands under ${GLM_FLASH_CACHE:-$HOME/.cache/glm-flash}; a second run finds
the files there (wheels re-verified against the sha256 PyPI gives, control/pypi_cache.py) and
fetches nothing.
Used by tests/cuda (the header compile proof) and by the sandbox header test.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
from control import pypi_cache  # noqa: E402
from control.pypi_cache import cache_dir  # noqa: E402

# The 12.8 header (no nvcc binary inside) and CUDA 13.0's compiler (docs/sources.md §6).
HEADER_WHEEL = ("nvidia-cuda-nvcc-cu12", "12.8.93")
COMPILER_WHEELS = (
    ("nvidia-cuda-nvcc", "13.0.88"),
    ("nvidia-nvvm", "13.0.88"),
    ("nvidia-cuda-crt", "13.0.88"),
    ("nvidia-cuda-runtime", "13.0.96"),
)

FETCHED: list[str] = []  # what this process downloaded (tests report it)


def wheel(name: str, version: str) -> Path:
    """Path of the verified x86_64 wheel in the cache; downloads it only when missing or corrupt."""
    return pypi_cache.wheel(name, version, accept=("x86_64",), fetched=FETCHED)


MIRROR = os.environ.get("GLM_FLASH_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def apt_install(*packages: str) -> None:
    """Install Debian packages the tests need on this machine (`make deps` normally has)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    if subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def rootfs_tarball(suite: str, packages: tuple[str, ...]) -> Path:
    """A minbase Debian rootfs with `packages`, built once by mmdebstrap and cached as a tarball."""
    key = hashlib.sha256(f"{suite} {MIRROR} {' '.join(sorted(packages))}".encode()).hexdigest()[:12]
    out = cache_dir() / "rootfs" / f"{suite}-{key}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    if not shutil.which("mmdebstrap"):
        apt_install("mmdebstrap")
    tmp = out.with_suffix(".part.tar")
    t0 = time.monotonic()
    subprocess.run(
        [
            "mmdebstrap",
            "--mode=root",
            "--variant=minbase",
            "--format=tar",
            "--quiet",
            "--include=" + ",".join(packages),
            suite,
            str(tmp),
            f"deb {MIRROR} {suite} main",
        ],
        check=True,
    )
    tmp.replace(out)
    FETCHED.append(f"{out.name} ({time.monotonic() - t0:.0f} s)")
    return out


# --- what the tests take out of the wheels -------------------------------------------------

HEADER_IN_12 = "nvidia/cuda_nvcc/include/crt/math_functions.h"
HEADER_IN_13 = "nvidia/cu13/include/crt/math_functions.h"


def member_text(wheel_path: Path, member: str) -> str:
    with zipfile.ZipFile(wheel_path) as z:
        return z.read(member).decode("utf-8")


def header_12_8() -> str:
    """The real crt/math_functions.h of CUDA 12.8 (nvidia-cuda-nvcc-cu12 12.8.93)."""
    return member_text(wheel(*HEADER_WHEEL), HEADER_IN_12)


def header_13_0() -> str:
    """CUDA 13.0's crt/math_functions.h (nvidia-cuda-crt 13.0.88), fixed upstream."""
    return member_text(wheel("nvidia-cuda-crt", "13.0.88"), HEADER_IN_13)


def patch_set_json(dest: Path) -> Path:
    """patches/cuda/math_functions-12.yaml converted to the JSON the host tools read."""
    import yaml

    data = yaml.safe_load((REPO / "patches" / "cuda" / "math_functions-12.yaml").read_text())
    dest.write_text(json.dumps(data, indent=1, sort_keys=True))
    return dest


def _extract(wheel_path: Path, strip: str, dest: Path, skip=()) -> None:
    """Extract the members under `strip` into dest, keeping the executable bits."""
    with zipfile.ZipFile(wheel_path) as z:
        for info in z.infolist():
            name = info.filename
            if not name.startswith(strip) or name.endswith("/") or name.endswith("__init__.py"):
                continue
            rel = name[len(strip) :]
            if rel in skip:
                continue
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            with z.open(info) as src, open(out, "wb") as f:
                shutil.copyfileobj(src, f)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(out, mode if mode else 0o644)
            if rel.startswith(("bin/", "nvvm/bin/")) and "." not in os.path.basename(rel):
                os.chmod(out, 0o755)


def toolkit_tree(dest: Path) -> Path:
    """A tree laid out like /usr/local/cuda-12.8: CUDA 13.0's compiler with CUDA 12.8's crt headers.

    Only 13.0's nvcc can run here (the 12.8 wheel has no nvcc binary); 13.0's own
    crt/host_runtime.h and ptxas go with it (docs/sources.md §6). Every other crt/ header,
    math_functions.h among them, is 12.8's. Returns the 12.8 math_functions.h in the tree.
    """
    target = dest / "targets" / "x86_64-linux"
    for name, version in COMPILER_WHEELS:
        w = wheel(name, version)
        _extract(w, "nvidia/cu13/", dest)
    # headers and libraries live under targets/, as in a real toolkit
    for sub in ("include", "lib"):
        (target / sub).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(dest / sub), str(target / sub))
    _extract(
        wheel(*HEADER_WHEEL), "nvidia/cuda_nvcc/include/crt/", target / "include" / "crt", skip=("host_runtime.h",)
    )
    os.symlink("targets/x86_64-linux/include", dest / "include")
    os.symlink("targets/x86_64-linux/lib", dest / "lib64")
    header = target / "include" / "crt" / "math_functions.h"
    assert header.read_text() == header_12_8()
    return header


def field_edit(text):
    """The field report's hand edit: a plain noexcept (true) on the four declarations."""
    out, n = re.subn(
        r"^(extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ (?:double|float) +"
        r"(?:sinpi|sinpif|cospi|cospif)\((?:double|float) x\));$",
        r"\1 noexcept (true);",
        text,
        flags=re.M,
    )
    assert n == 4
    return out
