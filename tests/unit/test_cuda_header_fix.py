"""The CUDA 12.x header patch set and glm-flash-fix-cuda-header, on the real 12.8 header.

The header comes from NVIDIA's nvidia-cuda-nvcc-cu12==12.8.93 wheel and the upstream-fixed
one from nvidia-cuda-crt==13.0.88 (both cached, see tests/cuda/cuda_assets.py). These
tests do not compile; tests/cuda/test_header_compile.py proves the edit with a real nvcc.
"""

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
import cuda_assets  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "files" / "glm-flash-patch"
FIX = REPO / "files" / "glm-flash-fix-cuda-header"
DECLS = ("sinpi(double x)", "sinpif(float x)", "cospi(double x)", "cospif(float x)")


@pytest.fixture(scope="module")
def h128():
    return cuda_assets.header_12_8()


@pytest.fixture
def env(tmp_path):
    pset = cuda_assets.patch_set_json(tmp_path / "set.json")
    e = dict(
        os.environ,
        GLM_FLASH_STATE_DIR=str(tmp_path / "state"),
        GLM_FLASH_CUDA_HEADER_SET=str(pset),
        GLM_FLASH_PATCH_TOOL=str(PATCH),
    )
    e.pop("GLM_FLASH_GLIBC_VERSION", None)
    return e


@pytest.fixture
def tree(tmp_path, h128):
    """A /usr/local lookalike: cuda-12.8 with the real header, cuda-12 -> cuda-12.8, cuda-13.0."""
    prefix = tmp_path / "usr-local"
    header = prefix / "cuda-12.8" / "targets" / "x86_64-linux" / "include" / "crt" / "math_functions.h"
    header.parent.mkdir(parents=True)
    header.write_text(h128)
    (prefix / "cuda-12").symlink_to("cuda-12.8")
    return prefix, header


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run(cmd, env, **kw):
    return subprocess.run([sys.executable, *map(str, cmd)], env=env, capture_output=True, text=True, **kw)


def patch(action, env, header):
    r = run([PATCH, action, env["GLM_FLASH_CUDA_HEADER_SET"], "--file", header, "--json"], env)
    return r.returncode, json.loads(r.stdout.splitlines()[0])[str(header)]["state"], r


# --- the patch data through glm-flash-patch ----------------------------------------------


def test_real_header_has_the_four_declarations_once(h128):
    for d in DECLS:
        assert (
            len(re.findall(r"extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ \w+ +" + re.escape(d) + ";", h128))
            == 1
        ), d


def test_pending_then_applied_then_noop(env, tree):
    _, header = tree
    before = sha(header)
    assert patch("check", env, header)[:2] == (1, "pending")
    rc, _, r = patch("apply", env, header)
    assert rc == 0, r.stderr
    text = header.read_text()
    for d in DECLS:
        assert f"{d} __GLM_FLASH_GLIBC_PI_THROW;" in text
    assert "(__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 41))" in text
    assert "defined(__cplusplus)" in text
    assert patch("check", env, header)[:2] == (0, "applied")
    after = sha(header)
    mtime = header.stat().st_mtime_ns
    rc, state, r = patch("apply", env, header)
    assert (rc, state) == (0, "applied") and "patched" not in r.stdout
    assert sha(header) == after != before and header.stat().st_mtime_ns == mtime
    # the original is kept once, byte for byte, and the manifest records both hashes
    orig = Path(env["GLM_FLASH_STATE_DIR"]) / "originals" / str(header).lstrip("/")
    assert sha(orig) == before
    manifest = json.loads(
        (Path(env["GLM_FLASH_STATE_DIR"]) / "manifests" / "cuda-math-functions-glibc-2.41.json").read_text()
    )
    entry = manifest["files"][str(header)]
    assert (entry["original_sha256"], entry["patched_sha256"]) == (before, after)
    assert entry["edits"] == ["sinpi", "sinpif", "cospi", "cospif"]


def test_hand_edited_header_refused_nothing_written(env, tree, h128):
    _, header = tree
    header.write_text(cuda_assets.field_edit(h128))
    before = sha(header)
    rc, state, r = patch("apply", env, header)
    assert (rc, state) == (2, "drift")
    assert "refused" in r.stderr
    assert sha(header) == before
    assert not (Path(env["GLM_FLASH_STATE_DIR"]) / "originals").exists()


def test_partly_patched_header_refused(env, tree, h128):
    _, header = tree
    pset = json.loads(Path(env["GLM_FLASH_CUDA_HEADER_SET"]).read_text())
    edit = pset["files"][0]["edits"][2]
    header.write_text(h128.replace(edit["anchor"], edit["replace"]))
    before = sha(header)
    rc, state, r = patch("apply", env, header)
    assert (rc, state) == (2, "drift") and "partly" in r.stdout + r.stderr
    assert sha(header) == before


def test_cuda_13_header_reported_upstream(env, tmp_path):
    header = tmp_path / "math_functions.h"
    header.write_text(cuda_assets.header_13_0())
    before = sha(header)
    assert patch("check", env, header)[:2] == (0, "upstream")
    assert patch("apply", env, header)[:2] == (0, "upstream")
    assert sha(header) == before


# --- the command -------------------------------------------------------------------------


def fix(env, *args, glibc=None):
    e = dict(env)
    if glibc:
        e["GLM_FLASH_GLIBC_VERSION"] = glibc
    return run([FIX, *args], e)


def test_check_exit_codes_and_discovery(env, tree, h128):
    prefix, header = tree
    before = sha(header)
    r = fix(env, "--check", "--prefix", prefix, glibc="2.41")
    assert r.returncode == 1, r.stdout + r.stderr
    # cuda-12 -> cuda-12.8 is one toolkit: reported once
    assert r.stdout.count("needs fix") == 1 and str(header) in r.stdout
    assert sha(header) == before, "--check must not write"
    assert not (Path(env["GLM_FLASH_STATE_DIR"]) / "originals").exists()

    r = fix(env, "--prefix", prefix, glibc="2.41")
    assert r.returncode == 0 and f"fixed     {header}" in r.stdout, r.stdout + r.stderr
    fixed = sha(header)
    assert fixed != before

    r = fix(env, "--check", "--prefix", prefix, glibc="2.41")
    assert r.returncode == 0 and "already fixed" in r.stdout
    r = fix(env, "--prefix", prefix, glibc="2.42")
    assert r.returncode == 0 and "already fixed" in r.stdout and sha(header) == fixed
    r = fix(env, "--quiet", "--prefix", prefix, glibc="2.41")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_explicit_header_argument(env, tree):
    _, header = tree
    assert fix(env, "--check", header, glibc="2.41").returncode == 1
    assert fix(env, header, glibc="2.41").returncode == 0
    assert fix(env, "--check", header, glibc="2.41").returncode == 0
    r = fix(env, "--check", str(header) + ".nope", glibc="2.41")
    assert r.returncode == 2 and "no such header" in r.stderr and "Traceback" not in r.stderr


def test_old_glibc_not_needed(env, tree):
    prefix, header = tree
    before = sha(header)
    for args in (("--check",), ()):
        r = fix(env, *args, "--prefix", prefix, glibc="2.36")
        assert r.returncode == 0 and "not needed" in r.stdout, r.stdout + r.stderr
    assert sha(header) == before


def test_glibc_read_from_this_hosts_headers(env, tree):
    """No override: the version comes from /usr/include/features.h (Debian 12 here: 2.36)."""
    prefix, _ = tree
    m = re.search(r"define\s+__GLIBC_MINOR__\s+(\d+)", Path("/usr/include/features.h").read_text())
    r = fix(env, "--check", "--prefix", prefix)
    if int(m.group(1)) >= 41:
        assert r.returncode == 1 and "needs fix" in r.stdout
    else:
        assert r.returncode == 0 and f"glibc 2.{m.group(1)} < 2.41" in r.stdout


def test_hand_edited_header_refused_with_recovery(env, tree, h128):
    prefix, header = tree
    header.write_text(cuda_assets.field_edit(h128))
    before = sha(header)
    for args in (("--check",), ()):
        r = fix(env, *args, "--prefix", prefix, glibc="2.41")
        assert r.returncode == 2
        assert "edited by hand" in r.stderr and "Nothing was written" in r.stderr
        assert "reinstall" in r.stderr and "run glm-flash-fix-cuda-header again" in r.stderr
        assert "Traceback" not in r.stderr
    assert sha(header) == before
    # on old glibc the same header breaks compiles: warned, not touched
    r = fix(env, "--prefix", prefix, glibc="2.36")
    assert r.returncode == 0 and "warning" in r.stderr and sha(header) == before


def test_upstream_header_nothing_to_do(env, tree):
    prefix, header = tree
    header.write_text(cuda_assets.header_13_0())
    before = sha(header)
    r = fix(env, "--prefix", prefix, glibc="2.41")
    assert r.returncode == 0 and "upstream" in r.stdout and sha(header) == before


def test_no_toolkit_and_missing_patch_data(env, tmp_path):
    r = fix(env, "--check", "--prefix", tmp_path / "empty", glibc="2.41")
    assert r.returncode == 0 and "nothing to do" in r.stdout
    e = dict(env, GLM_FLASH_CUDA_HEADER_SET=str(tmp_path / "gone.json"))
    r = fix(e, "--check", glibc="2.41")
    assert r.returncode == 2 and "patch set" in r.stderr and "Traceback" not in r.stderr


def test_symlinked_and_second_toolkit_each_fixed_once(env, tree, h128):
    prefix, header = tree
    other = prefix / "cuda-12.9" / "targets" / "x86_64-linux" / "include" / "crt" / "math_functions.h"
    other.parent.mkdir(parents=True)
    other.write_text(h128)
    r = fix(env, "--prefix", prefix, glibc="2.41")
    assert r.returncode == 0 and r.stdout.count("fixed     ") == 2, r.stdout
    assert sha(header) == sha(other) != hashlib.sha256(h128.encode()).hexdigest()
