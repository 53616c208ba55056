"""NVIDIA's sources on the deployed sandbox: the key trusted by fingerprint, the branch checked
before anything changes, the branch held when a newer one appears, the 12.8 toolkit from
the runfile with the header fix in its tree.

Simulated: NVIDIA's repository and runfile, by the stand-in `make sandbox-up` builds and
serves on loopback (sandbox/nvidia_standin.py): NVIDIA's flat layout and package names, an
InRelease signed by a test key, packages that install files (not drivers), a runfile that
honours the real one's toolkit options. apt, its signature checks, gpg, dpkg and the deploy
are real. The same checks run on a real host in tests/host/test_driver.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO, SANDBOX_INVENTORY, changed_operations, inventory_hosts, pyinfra, sandbox_sh

pytestmark = pytest.mark.sandbox

STANDIN = REPO / ".sandbox/rootfs/srv/glm-flash-standin"
TOOLKIT = "/usr/local/cuda-12.8"
HEADER = f"{TOOLKIT}/targets/x86_64-linux/include/crt/math_functions.h"
OTHER_FPR = "EB693B3035CD5710E231E123A4B469963BF863CC"  # debian12's key: right shape, wrong key


sh = sandbox_sh


def deploy(*data: str) -> subprocess.CompletedProcess:
    args = [a for d in data for a in ("--data", d)]
    return pyinfra("--json", *args, SANDBOX_INVENTORY, "deploy.py")


def apt_state() -> str:
    """What a refused run must leave as it was: NVIDIA's key and sources, packages, holds."""
    return sh(
        "sha256sum /etc/apt/keyrings/glm-flash-nvidia-cuda.gpg /etc/apt/sources.list.d/glm-flash-nvidia-cuda.sources;"
        " dpkg-query -W -f='${Package} ${Version} ${Status}\\n' | sort | sha256sum; apt-mark showhold"
    ).stdout


@pytest.fixture(scope="module")
def deployed(sandbox):
    """The stand-in's facts, on the deployed sandbox (each test puts back what it changes)."""
    return json.loads((STANDIN / "standin.json").read_text())


def test_the_standins_key_is_trusted_by_its_fingerprint(deployed):
    keys = sh(
        "gpg --batch --no-default-keyring --with-colons --show-keys /etc/apt/keyrings/glm-flash-nvidia-cuda.gpg"
    ).stdout
    assert f"fpr:::::::::{deployed['fingerprint']}:" in keys
    policy = sh("apt-cache policy nvidia-driver-cuda").stdout
    assert "Installed: 590.48.01-1" in policy and "Candidate: 590.48.01-1" in policy, policy


def test_a_key_with_another_fingerprint_is_refused_and_nothing_changes(deployed):
    before = apt_state()
    run = deploy(f"nvidia_repo_key_fingerprint={OTHER_FPR}")
    assert run.returncode != 0
    assert f"has fingerprint {deployed['fingerprint']}, nvidia_repo_key_fingerprint is {OTHER_FPR}" in run.stderr, (
        run.stderr[-3000:]
    )
    assert "Nothing was changed" in run.stderr
    assert apt_state() == before


def test_a_repository_signed_by_another_key_is_refused(deployed):
    """The published key is the pinned one, but InRelease is signed by another (a tampered
    mirror): apt's own signature check in the throwaway state refuses it, nothing is written."""
    from sandbox.nvidia_standin import gpg, signing_key

    ((_, data),) = inventory_hosts(SANDBOX_INVENTORY)
    repo = STANDIN / deployed["repo_path"]
    saved = {name: (repo / name).read_bytes() for name in ("InRelease", "Release.gpg")}
    home = Path(tempfile.mkdtemp(prefix="gk", dir="/tmp"))  # gpg's agent socket needs a short path
    signing_key(home)
    release = (repo / "Release").read_bytes()
    try:
        (repo / "InRelease").write_bytes(gpg(home, "--clearsign", data=release))
        (repo / "Release.gpg").write_bytes(gpg(home, "--armor", "--detach-sign", data=release))
        sh("rm -rf /tmp/glm-flash-test-repo")
        r = sh(
            f"/opt/glm-flash/bin/glm-flash-nvidia-repo setup --repo {data['nvidia_repo_url']} "
            f"--key-url {data['nvidia_repo_key_url']} --fingerprint {deployed['fingerprint']} --branch 590 "
            "--package nvidia-driver-cuda --keyring /tmp/glm-flash-test-repo/key.gpg "
            "--sources /tmp/glm-flash-test-repo/nvidia.sources",
            check=False,
        )
        assert r.returncode == 2 and "apt cannot use" in r.stderr, r.stdout + r.stderr
        assert "NO_PUBKEY" in r.stderr or "not signed" in r.stderr or "signature" in r.stderr.lower(), r.stderr
        assert sh("test -e /tmp/glm-flash-test-repo", check=False).returncode != 0
    finally:
        for name, content in saved.items():
            (repo / name).write_bytes(content)
        shutil.rmtree(home, ignore_errors=True)


def test_a_branch_the_repository_lacks_is_refused_listing_those_it_has(deployed):
    before = apt_state()
    run = deploy('driver_branch="580"')  # quoted: pyinfra reads a bare 580 as a number
    assert run.returncode != 0
    assert "driver_branch 580:" in run.stderr and "it carries 590, 595" in run.stderr, run.stderr[-3000:]
    assert "Nothing was installed or removed" in run.stderr
    assert apt_state() == before


def test_the_branch_holds_when_a_newer_one_appears(deployed):
    from sandbox.nvidia_standin import build, index
    from sandbox.sandbox import control_dir

    home = control_dir() / "gnupg"
    repo = STANDIN / json.loads((STANDIN / "standin.json").read_text())["repo_path"]
    build(STANDIN, home, {"610": "610.20.03-1"})  # NVIDIA publishes a newer branch
    try:
        sh("apt-get update -q")
        assert "610.20.03-1" in sh("apt-cache madison nvidia-driver-cuda").stdout
        # What a dist-upgrade would install, from apt's own solver (-s: the same decision, without
        # downloading and installing whatever Debian published since the image was cut).
        upgrade = sh("DEBIAN_FRONTEND=noninteractive apt-get -s -q dist-upgrade").stdout
        inst = [line for line in upgrade.splitlines() if line.startswith("Inst ")]
        assert not [line for line in inst if "nvidia" in line or "cuda" in line], inst
        assert sh("dpkg-query -W -f='${Version}' nvidia-driver-cuda").stdout == "590.48.01-1"
        second = deploy()
        assert second.returncode == 0 and changed_operations(second.stdout) == []
    finally:  # the stand-in as sandbox-up built it: branch 610 unpublished again, for the tests after
        for deb in repo.glob("*_610.20.03-1_amd64.deb"):
            deb.unlink()
        index(repo, home)
        sh("apt-get update -q")


def test_the_runfile_is_checked_before_it_runs_and_the_header_fixed_in_its_tree(deployed):
    assert sh(f"cat {TOOLKIT}/.glm-flash-runfile").stdout.strip() == deployed["runfile_sha256"]
    assert "release 12.8," in sh(f"{TOOLKIT}/bin/nvcc --version").stdout
    assert sh("/usr/local/sbin/glm-flash-fix-cuda-header --check", check=False).returncode == 0
    assert "__GLIBC_MINOR__" in sh(f"cat {HEADER}").stdout
    sh(f"rm -rf {TOOLKIT}")
    wrong = "a" * 64  # (all digits would reach pyinfra --data as a number)
    run = deploy(f"cuda_runfile_sha256={wrong}")
    assert run.returncode != 0
    assert f"sha256 {deployed['runfile_sha256']} is not cuda_runfile_sha256 {wrong}" in run.stderr, run.stderr[-3000:]
    assert sh(f"test -e {TOOLKIT}", check=False).returncode != 0, "a refused runfile must install nothing"
    again = deploy()
    assert again.returncode == 0, again.stderr[-3000:]
    assert "CUDA 12.8 toolkit at /usr/local/cuda-12.8" in changed_operations(again.stdout)
    assert "__GLIBC_MINOR__" in sh(f"cat {HEADER}").stdout  # the fix lands in the new tree too
    last = deploy()
    assert last.returncode == 0 and changed_operations(last.stdout) == []
