"""The CUDA header fix and its dpkg hook, for real, in the booted Debian 13 sandbox.

A toolkit tree laid out like NVIDIA's packaged ones comes from a small .deb built here with
dpkg-deb; it carries the real CUDA 12.8 crt/math_functions.h (nvidia-cuda-nvcc-cu12
12.8.93), under /usr/local/cuda-12.9 so it stays apart from the deploy's own 12.8 tree (the
runfile's, which has no dpkg hook: tests/sandbox/test_nvidia_sources.py). Simulated: only the package itself (NVIDIA's apt repository is unreachable here),
so its name is ours. glibc 2.41, apt, dpkg, the hook and the deploy are real.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from control import layout
from tests.conftest import REPO, SANDBOX_INVENTORY, changed_operations, pyinfra

sys.path.insert(0, str(REPO / "tests" / "cuda"))
import cuda_assets  # noqa: E402

from sandbox.nvidia_standin import deb  # noqa: E402

pytestmark = pytest.mark.sandbox

PKG, DUMMY = "glm-flash-test-cuda-crt-12-8", "glm-flash-test-dummy"
HEADER = "/usr/local/cuda-12.9/targets/x86_64-linux/include/crt/math_functions.h"
OP = "CUDA 12.x math_functions.h fixed for glibc >= 2.41"
LOG = "/var/log/glm-flash/cuda-header.log"
APT = "DEBIAN_FRONTEND=noninteractive apt-get install -y --reinstall"


def sh(command: str, check: bool = True, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/ssh_config"), "sandbox", command],
        capture_output=True,
        input=stdin,
        timeout=300,
    )
    r.stdout, r.stderr = r.stdout.decode(), r.stderr.decode()
    if check:
        assert r.returncode == 0, f"{command}: {r.stdout}{r.stderr}"
    return r


def deploy() -> list[str]:
    run = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")
    assert run.returncode == 0, run.stderr[-6000:]
    return changed_operations(run.stdout)


def build_deb(tmp: Path, name: str, files: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    return deb(
        tmp,
        name,
        "12.8.93-1",
        files,
        "Laid out like NVIDIA's cuda-crt packages; built by tests/sandbox/test_cuda_header_hook.py.",
        links or {},
        source="glm-flash-tests",
    )


def sha_on_sandbox(path: str) -> str:
    return sh(f"sha256sum {path}").stdout.split()[0]


@pytest.fixture(scope="module")
def debs(sandbox, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("debs")
    header = cuda_assets.header_12_8().encode()
    cuda = build_deb(tmp, PKG, {HEADER: header}, {"/usr/local/cuda-12.9/include": "targets/x86_64-linux/include"})
    dummy = build_deb(tmp, DUMMY, {f"/usr/share/doc/{DUMMY}/README": b"unrelated package\n"})
    for name, built in ((PKG, cuda), (DUMMY, dummy)):
        sh(f"cat > /tmp/{name}.deb", stdin=built.read_bytes())
    sh(f"dpkg --purge {PKG} {DUMMY} >/dev/null")
    deploy()  # converge first, so the counts below are this test's alone
    yield hashlib.sha256(header).hexdigest()
    sh(f"DEBIAN_FRONTEND=noninteractive apt-get purge -y {PKG} {DUMMY}", check=False)


def test_deploy_fixes_hook_refixes_after_reinstall_second_deploy_no_change(debs):
    original = debs
    assert sh("getconf GNU_LIBC_VERSION").stdout.strip() == "glibc 2.41"

    # plain dpkg runs no apt hook: the header lands as shipped, and --check says so
    sh(f"dpkg -i /tmp/{PKG}.deb")
    assert sha_on_sandbox(HEADER) == original
    r = sh("glm-flash-fix-cuda-header --check", check=False)
    assert r.returncode == 1 and f"needs fix {HEADER}" in r.stdout

    # the deploy fixes it, as its only change
    assert deploy() == [OP]
    fixed = sha_on_sandbox(HEADER)
    assert fixed != original
    assert (
        "__GLM_FLASH_GLIBC_PI_THROW"
        in sh(f"grep -c __GLM_FLASH_GLIBC_PI_THROW {HEADER}; grep -m1 __GLM_FLASH_GLIBC_PI_THROW {HEADER}").stdout
    )
    kept = f"{layout.PATCH_STATE}/originals{HEADER}"
    assert sha_on_sandbox(kept) == original

    # an apt reinstall rewrites the original; the hook fixes it again in the same apt run
    fixes_before = int(sh(f"grep -c 'fixed     {HEADER}' {LOG} || true").stdout.strip() or 0)
    r = sh(f"{APT} /tmp/{PKG}.deb")
    assert f"glm-flash: fixed     {HEADER}" in r.stdout + r.stderr, r.stdout + r.stderr
    assert int(sh(f"grep -c 'fixed     {HEADER}' {LOG}").stdout.strip()) == fixes_before + 1
    assert sha_on_sandbox(HEADER) == fixed
    # dpkg's own checksum shows the file differs from what the package shipped: the fix is on it
    assert HEADER in sh(f"dpkg --verify {PKG}", check=False).stdout
    assert sha_on_sandbox(kept) == original, "the original is kept once"

    # converged: the next deploy changes nothing
    assert deploy() == []


def test_hook_failure_never_fails_apt_and_is_logged(debs):
    sh(f"{APT} /tmp/{PKG}.deb")
    # someone applies the field's unguarded edit by hand: the fix refuses it ...
    sh(
        f"sed -i -E 's/^(extern .* (sinpi|sinpif|cospi|cospif)\\((double|float) x\\)) __GLM_FLASH_GLIBC_PI_THROW;/"
        f"\\1 noexcept (true);/' {HEADER}"
    )
    assert int(sh(f"grep -c 'noexcept (true);' {HEADER}").stdout.strip()) == 4
    edited = sha_on_sandbox(HEADER)
    # ... but an unrelated apt run still succeeds, and says loudly what is wrong
    r = sh(f"{APT} /tmp/{DUMMY}.deb", check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "FAILED after this dpkg run" in out and "edited by hand" in out, out
    assert f"apt-get install --reinstall {PKG}" in out, "the refusal names the package to reinstall"
    assert "refused" in sh(f"tail -n 5 {LOG}").stdout
    assert sha_on_sandbox(HEADER) == edited, "a refused header is not written"
    # following the advice recovers
    sh(f"{APT} /tmp/{PKG}.deb")
    assert sh("glm-flash-fix-cuda-header --check").returncode == 0
    assert deploy() == []
