"""The CUDA 12.x header fix on a deployed node (roles/cuda_header.py).

Every CUDA 12.x math_functions.h is fixed where glibc >= 2.41, the dpkg hook is in place,
and a probe .cu that includes <cmath> compiles with the host's nvcc. Parts that need a
toolkit are reported not applicable where there is none and no GPU (the sandbox); a GPU
node without its toolkit fails.
"""

import json
import re
import shlex

import pytest

from roles import cuda_header

PROBE = r"""#include <cmath>
#include <cstdio>
__global__ void probe(double *d, float *f) { d[0] = sinpi(d[0]) + cospi(d[1]); f[0] = sinpif(f[0]) + cospif(f[1]); }
int main() { std::printf("%f\n", std::sin(1.0)); return 0; }
"""
MARKERS = ("__GLM_FLASH_GLIBC_PI_THROW", "__NV_IEC_60559_FUNCS_EXCEPTION_SPECIFIER")


@pytest.fixture(autouse=True)
def _enabled(profile):
    if not profile.fix_cuda_header:
        pytest.skip("not applicable: fix_cuda_header is false in the profile")


def glibc(host):
    m = re.match(r"glibc (\d+)\.(\d+)", host.run("getconf GNU_LIBC_VERSION").stdout.strip())
    return int(m.group(1)), int(m.group(2))


def cuda12_headers(host):
    out = host.run(
        "for f in /usr/local/cuda-12*/targets/*/include/crt/math_functions.h; do "
        "[ -f \"$f\" ] && readlink -f \"$f\"; done; true"
    )
    return sorted(set(out.stdout.split()))


def test_fix_command_and_patch_set_installed(host, profile):
    paths = cuda_header.locations(profile)
    tool = host.file(paths["tool"])
    assert tool.exists and tool.mode == 0o755 and tool.user == "root"
    assert host.file(f"/usr/local/sbin/{cuda_header.TOOL}").linked_to == paths["tool"]
    pset = json.loads(host.file(paths["patch_set"]).content_string)
    assert [e["id"] for e in pset["files"][0]["edits"]] == ["sinpi", "sinpif", "cospi", "cospif"]
    assert host.file(f"{profile.install_root}/bin/glm-flash-patch").mode == 0o755


def test_dpkg_hook_installed(host, profile):
    hook = host.file(cuda_header.HOOK)
    assert hook.exists and hook.mode == 0o644 and hook.user == "root"
    dump = host.run("apt-config dump DPkg::Post-Invoke")
    assert dump.rc == 0
    assert f"{cuda_header.locations(profile)['tool']} --dpkg-hook" in dump.stdout, dump.stdout


def test_check_passes(host, profile):
    """--check exits 0: every CUDA 12.x header is fixed, fixed upstream, or not needed (glibc < 2.41)."""
    r = host.run(shlex.quote(cuda_header.locations(profile)["tool"]) + " --check")
    assert r.rc == 0, r.stdout + r.stderr


def test_every_cuda12_header_fixed(host, has_gpu):
    headers = cuda12_headers(host)
    if not headers:
        if has_gpu:
            pytest.fail("no CUDA 12.x toolkit on a GPU node")
        pytest.skip("not applicable: no CUDA 12.x toolkit on this host (no GPU)")
    if glibc(host) < (2, 41):
        pytest.skip(f"not applicable: glibc {'.'.join(map(str, glibc(host)))} < 2.41 needs no fix")
    for h in headers:
        text = host.file(h).content_string
        assert any(m in text for m in MARKERS), f"{h} is not fixed"
        for name, arg in (("sinpi", "double"), ("sinpif", "float"), ("cospi", "double"), ("cospif", "float")):
            assert f"{name}({arg} x);" not in text, f"{h}: {name} still undecorated"


def test_probe_compiles_with_the_toolkits_nvcc(host, profile, has_gpu):
    if not profile.cuda_version.startswith("12."):
        pytest.skip(f"not applicable: cuda_version {profile.cuda_version} is not 12.x")
    nvcc = f"/usr/local/cuda-{profile.cuda_version}/bin/nvcc"
    if not has_gpu:
        pytest.skip("not applicable: no GPU (the sandbox's toolkit is a stand-in without a compiler)")
    if not host.file(nvcc).exists:
        pytest.fail(f"{nvcc} is missing on a GPU node")
    d = host.run("mktemp -d").stdout.strip()
    try:
        host.run(f"cat > {d}/probe.cu <<'EOF'\n{PROBE}EOF")
        r = host.run(f"cd {d} && {nvcc} -c probe.cu -o probe.o")
        assert r.rc == 0, r.stdout + r.stderr
        assert "exception specification is incompatible" not in r.stderr
        assert host.file(f"{d}/probe.o").size > 0
    finally:
        host.run(f"rm -rf {d}")
