"""files/glm-flash-nvidia-repo on this machine: real gpg reading real keys, and the runfile
path with a runfile shaped like NVIDIA's (sandbox/nvidia_standin.py). What needs apt and a
repository runs in the sandbox (tests/sandbox/test_nvidia_sources.py)."""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from pathlib import Path

import pytest

from sandbox.nvidia_standin import runfile, signing_key
from tests.conftest import host_tool

REPO = Path(__file__).resolve().parents[2]


def load_tool():
    return host_tool("glm-flash-nvidia-repo", "glm_flash_nvidia_repo")


tool = load_tool()


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    """Two real OpenPGP keys, armored, and their fingerprints (gpg's homedir must be short)."""
    out = []
    for _ in range(2):
        home = Path(tempfile.mkdtemp(prefix="gk", dir="/tmp"))  # gpg's agent socket needs a short path
        fpr = signing_key(home)
        armored = subprocess.run(
            ["gpg", "--batch", "--homedir", str(home), "--armor", "--export", fpr], capture_output=True, check=True
        ).stdout
        out.append((fpr, armored))
    return out


def test_primary_fingerprints_of_a_key_file(keys, tmp_path):
    (fpr1, key1), (fpr2, key2) = keys
    home = tmp_path / "g"
    home.mkdir(mode=0o700)
    assert tool.fingerprints(str(home), key1) == [fpr1]
    assert tool.fingerprints(str(home), key1 + key2) == [fpr1, fpr2]  # one key too many is not "the" key
    assert tool.fingerprints(str(home), b"<html>not found</html>") == []
    binary = tool.binary_key(str(home), key1)
    assert not binary.startswith(b"-----") and tool.fingerprints(str(home), binary) == [fpr1]


def setup_args(tmp_path, key_file, fingerprint):
    class Args:
        repo = "http://127.0.0.1:9/repo/"
        key_url = f"file://{key_file}"
        branch, package = "590", "nvidia-driver-cuda"
        keyring = str(tmp_path / "etc/keyrings/nvidia.gpg")
        sources = str(tmp_path / "etc/sources.list.d/nvidia.sources")

    Args.fingerprint = fingerprint
    return Args


def test_a_key_with_another_fingerprint_writes_nothing(keys, tmp_path):
    (fpr1, key1), (fpr2, _) = keys
    key_file = tmp_path / "key.asc"
    key_file.write_bytes(key1)
    with pytest.raises(tool.Fail) as e:
        tool.cmd_setup(setup_args(tmp_path, key_file, fpr2))
    assert f"has fingerprint {fpr1}, nvidia_repo_key_fingerprint is {fpr2}. Nothing was changed" in str(e.value)
    assert not (tmp_path / "etc").exists()


def test_only_https_or_file_keys(tmp_path):
    with pytest.raises(tool.Fail, match="only https:// or file:// URLs"):
        tool.fetch("http://127.0.0.1:9/key.asc")


def make_runfile(tmp_path) -> tuple[Path, str]:
    path = tmp_path / "cuda_12.8.1_570.124.06_linux.run"
    path.write_bytes(runfile(b"/* a header */\n"))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


class RunArgs:
    def __init__(self, url, sha256, toolkitpath):
        self.url, self.sha256, self.toolkitpath = url, sha256, toolkitpath


def test_runfile_refused_on_sha256_then_installed_toolkit_only(tmp_path, monkeypatch):
    monkeypatch.setattr(tool, "RUNFILE_CACHE", str(tmp_path / "cache"))
    run, digest = make_runfile(tmp_path)
    dest = tmp_path / "usr/local/cuda-12.8"
    with pytest.raises(tool.Fail, match=f"sha256 {digest} is not cuda_runfile_sha256 {'0' * 64}"):
        tool.cmd_runfile(RunArgs(f"file://{run}", "0" * 64, str(dest)))
    assert not dest.exists() and not list((tmp_path / "cache").iterdir())
    assert tool.cmd_runfile(RunArgs(f"file://{run}", digest, str(dest))) == 0
    assert (dest / "targets/x86_64-linux/include/crt/math_functions.h").read_bytes() == b"/* a header */\n"
    assert (
        "release 12.8," in subprocess.run([str(dest / "bin/nvcc"), "--version"], capture_output=True, text=True).stdout
    )
    assert (dest / ".glm-flash-runfile").read_text().strip() == digest
    assert not list((tmp_path / "cache").iterdir())  # the 5 GB runfile does not stay
    run.unlink()  # converged: no download, no run
    assert tool.cmd_runfile(RunArgs(f"file://{run}", digest, str(dest))) == 0


def test_the_runfile_standin_refuses_the_driver(tmp_path):
    run, _ = make_runfile(tmp_path)
    r = subprocess.run(
        ["sh", str(run), "--silent", "--driver", f"--toolkitpath={tmp_path}/x"], capture_output=True, text=True
    )
    assert r.returncode != 0 and not (tmp_path / "x").exists()


def test_apt_update_waits_while_apts_lists_lock_is_held_then_gives_apts_words(monkeypatch):
    """apt-daily holding the lists lock: tried again; anything else, or the wait over: apt's own answer."""
    answers = []

    def fake_run(cmd, **kw):
        assert cmd == ["apt-get", "-q", "update"]
        return answers.pop(0)

    def done(rc, err=""):
        return subprocess.CompletedProcess([], rc, "", err)

    locked = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 9 (apt-get)"
    monkeypatch.setattr(tool, "run", fake_run)
    answers[:] = [done(100, locked), done(100, locked), done(0)]
    assert tool.apt_update(wait_s=60, every_s=0).returncode == 0 and answers == []
    answers[:] = [done(100, "E: Failed to fetch"), done(0)]
    assert "Failed to fetch" in tool.apt_update(wait_s=60, every_s=0).stderr and len(answers) == 1
    answers[:] = [done(100, locked), done(0)]
    assert tool.apt_update(wait_s=0, every_s=0).returncode == 100 and len(answers) == 1
