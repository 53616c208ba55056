"""Proof of the CUDA 12.8 header fix with a real compiler, no GPU needed.

Real parts: CUDA 12.8's crt headers (nvidia-cuda-nvcc-cu12==12.8.93), CUDA 13.0's nvcc,
cicc, ptxas and runtime headers (the 12.8 wheel has no nvcc binary; docs/sources.md §6), a
Debian 13 root filesystem built by mmdebstrap (glibc 2.41, g++ 14), and this machine's own
Debian 12 (glibc 2.36, g++ 12) for "older glibc". The toolkit tree sits in the rootfs at
/usr/local/cuda-12.8, laid out like NVIDIA's, and glm-flash-fix-cuda-header runs inside
the rootfs without arguments, so discovery and the glibc detection are real too.

Nothing is simulated. Downloads and the rootfs tarball are cached under
${GLM_FLASH_CACHE:-~/.cache/glm-flash}; a second run fetches nothing.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_assets  # noqa: E402

from control.layout import PATCH_STATE  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ERROR = "exception specification is incompatible with that of previous function"
PROBE = r"""
#include <cmath>
#include <cstdio>
__global__ void probe(double *d, float *f)
{
    d[0] = sinpi(d[0]) + cospi(d[1]);
    f[0] = sinpif(f[0]) + cospif(f[1]);
}
int main() { std::printf("%f\n", std::sin(1.0) + ::sinpi(0.5)); return 0; }
"""
TIMES = {}
HEADER = "/usr/local/cuda-12.8/targets/x86_64-linux/include/crt/math_functions.h"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def trixie(tmp_path_factory):
    """A Debian 13 rootfs with g++, libc6-dev, python3, the 12.8 toolkit tree and our tools."""
    t0 = time.monotonic()
    fetched_before = len(cuda_assets.FETCHED)
    tarball = cuda_assets.rootfs_tarball("trixie", ("g++", "libc6-dev", "python3"))
    for name, version in (cuda_assets.HEADER_WHEEL, *cuda_assets.COMPILER_WHEELS):
        cuda_assets.wheel(name, version)
    TIMES["fetch"] = time.monotonic() - t0
    TIMES["fetched"] = cuda_assets.FETCHED[fetched_before:]
    t1 = time.monotonic()
    root = tmp_path_factory.mktemp("trixie")
    subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-xf", str(tarball)], check=True)
    header = cuda_assets.toolkit_tree(root / "usr/local/cuda-12.8")
    os.symlink("cuda-12.8", root / "usr/local/cuda-12")  # deduplicated by the command
    bin_dir = root / "opt/glm-flash/bin"
    bin_dir.mkdir(parents=True)
    # the tools and, beside them, the module they share, as the deploy installs them (roles/operations/uploads.py)
    for tool in ("glm-flash-patch", "glm-flash-fix-cuda-header", "glm_flash_host.py"):
        shutil.copy2(REPO / "files" / tool, bin_dir / tool)
    (root / "opt/glm-flash/patches/cuda").mkdir(parents=True)
    cuda_assets.patch_set_json(root / "opt/glm-flash/patches/cuda/math_functions-12.json")
    (root / "work").mkdir()
    (root / "work/probe.cu").write_text(PROBE)
    TIMES["setup"] = time.monotonic() - t1
    yield root, header
    shutil.rmtree(root, ignore_errors=True)
    summary = (
        f"cuda header proof: fetch/cache {TIMES['fetch']:.1f} s (downloaded: "
        f"{', '.join(TIMES['fetched']) or 'nothing'}), rootfs+tree setup {TIMES['setup']:.1f} s"
    )
    print("\n" + summary, file=sys.__stderr__)


def in_root(root: Path, *cmd: str) -> subprocess.CompletedProcess:
    """Run cmd chrooted in root, in a private mount namespace with its own /proc (gone on exit)."""
    script = 'mount -t proc proc "$0/proc" && exec chroot "$0" "$@"'
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    return subprocess.run(
        ["unshare", "--mount", "--fork", "sh", "-c", script, str(root), *cmd],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def nvcc(root: Path, out: str) -> subprocess.CompletedProcess:
    return in_root(root, "/usr/local/cuda-12.8/bin/nvcc", "-c", "/work/probe.cu", "-o", out)


def test_rootfs_is_glibc_2_41(trixie):
    root, _ = trixie
    r = in_root(root, "ldd", "--version")
    assert r.returncode == 0 and "2.41" in r.stdout.splitlines()[0], r.stdout + r.stderr


def test_fails_before_fix_compiles_after_and_second_run_changes_nothing(trixie):
    root, header = trixie
    fix = "/opt/glm-flash/bin/glm-flash-fix-cuda-header"
    original = _sha(header)

    # 1. the unfixed 12.8 header: the four errors the field saw, and no object
    r = nvcc(root, "/work/before.o")
    assert r.returncode != 0
    errors = re.findall(
        ERROR + r' "(\w+)" \(declared at line \d+ of /usr/local/cuda-12.8/bin/../targets/'
        r'x86_64-linux/include/crt/math_functions.h\)',
        r.stdout + r.stderr,
    )
    assert sorted(errors) == ["cospi", "cospif", "sinpi", "sinpif"], r.stdout + r.stderr
    assert not (root / "work/before.o").exists()

    # 2. --check sees the need, changes nothing
    r = in_root(root, fix, "--check")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.count("needs fix") == 1 and "(glibc 2.41)" in r.stdout
    assert _sha(header) == original

    # 3. fix, then the same compile succeeds
    t0 = time.monotonic()
    r = in_root(root, fix)
    assert (r.returncode, r.stdout.strip()) == (0, f"fixed     {HEADER}"), r.stdout + r.stderr
    fixed = _sha(header)
    assert fixed != original
    r = nvcc(root, "/work/after.o")
    TIMES["compile"] = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    assert ERROR not in r.stdout + r.stderr
    assert (root / "work/after.o").stat().st_size > 0

    # 4. a second run changes nothing: same bytes, same mtime, exit 0, --check exit 0
    mtime = header.stat().st_mtime_ns
    r = in_root(root, fix)
    assert (r.returncode, r.stdout.strip()) == (0, f"already fixed {HEADER}"), r.stdout + r.stderr
    assert in_root(root, fix, "--check").returncode == 0
    assert _sha(header) == fixed and header.stat().st_mtime_ns == mtime

    # the original is kept on the "host" (the rootfs) with a manifest
    state = root / PATCH_STATE.lstrip("/")
    assert _sha(state / "originals/usr/local/cuda-12.8/targets/x86_64-linux/include/crt/math_functions.h") == original
    assert (state / "manifests/cuda-math-functions-glibc-2.41.json").exists()

    (root / "work/fixed-math_functions.h").write_bytes(header.read_bytes())


@pytest.fixture(scope="module")
def host_tree(tmp_path_factory):
    """The same toolkit tree on this machine (Debian 12: glibc 2.36, g++ 12)."""
    if not shutil.which("g++"):
        cuda_assets.apt_install("g++", "libc6-dev")
    top = tmp_path_factory.mktemp("cuda-12.8-host")
    header = cuda_assets.toolkit_tree(top)
    (top / "probe.cu").write_text(PROBE)
    yield top, header
    shutil.rmtree(top, ignore_errors=True)


def host_glibc_minor() -> int:
    m = re.search(r"define\s+__GLIBC_MINOR__\s+(\d+)", Path("/usr/include/features.h").read_text())
    return int(m.group(1))


def host_nvcc(top: Path, out: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(top / "bin/nvcc"), "-c", str(top / "probe.cu"), "-o", str(top / out)],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_fixed_header_compiles_on_older_glibc(trixie, host_tree):
    """The header fixed on glibc 2.41 still compiles here, where the field's plain noexcept does not."""
    root, _ = trixie
    top, header = host_tree
    assert host_glibc_minor() < 41, "this test needs a host with glibc older than 2.41 (Debian 12)"
    fixed = root / "work/fixed-math_functions.h"
    assert fixed.exists(), "the trixie test did not produce a fixed header"

    r = host_nvcc(top, "orig.o")
    assert r.returncode == 0, "the unmodified 12.8 header should compile on glibc < 2.41:\n" + r.stderr

    header.write_bytes(fixed.read_bytes())
    r = host_nvcc(top, "fixed.o")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (top / "fixed.o").stat().st_size > 0

    # control: the field's unguarded edit breaks this compile (so this test can tell them apart)
    header.write_text(cuda_assets.field_edit(cuda_assets.header_12_8()))
    r = host_nvcc(top, "field.o")
    assert r.returncode != 0 and "different exception specifier" in r.stderr, r.stderr
