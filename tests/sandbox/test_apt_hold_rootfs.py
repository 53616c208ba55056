"""apt holds, the driver pin and the install guards, for real in a Debian 13 rootfs.

A minbase trixie root filesystem (main contrib non-free, apt lists kept) is built once
by mmdebstrap and cached as a tarball under $GLM_FLASH_CACHE; each run unpacks it and
works offline through chroot:
- `apt_hold.held` runs through pyinfra's own CLI and @chroot connector: the first run
  holds, the second changes nothing, `present=False` releases; the fact reads real
  `apt-mark showhold` output.
- The apt pin the driver role writes is read by trixie's apt: Debian's own 550 driver
  packages get priority 1000 with driver_branch 550 and stay at 500 with 580.
- The shell guards the roles yield (driver branch check after install, toolkit plan
  refusing driver packages) run against trixie's real packages.
NVIDIA's repository is not reachable here, so the pin is proven on Debian's nvidia
packages. Fresh machine: ~35 s to build the rootfs (once), ~5 s per run after.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "unit"))

from fakehost import commands  # noqa: E402
from pyinfra.facts.deb import DebPackages  # noqa: E402
from pyinfra.facts.files import FileContents  # noqa: E402

from roles.facts.apt import AptHeldPackages  # noqa: E402
from roles.facts.driver import AptVersions, Kernels, KernelState  # noqa: E402
from roles.operations import driver as driver_ops  # noqa: E402
from roles.operations import toolkit as toolkit_ops  # noqa: E402

SOURCES = "deb http://deb.debian.org/debian trixie main contrib non-free"
CACHE = Path(os.environ.get("GLM_FLASH_CACHE", Path.home() / ".cache" / "glm-flash")) / "rootfs"
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("mmdebstrap"), reason="needs root and mmdebstrap to build a Debian 13 rootfs"
)


def _tarball() -> Path:
    key = hashlib.sha256(f"minbase trixie lists {SOURCES}".encode()).hexdigest()[:12]
    tar = CACHE / f"trixie-minbase-lists-{key}.tar"
    if not tar.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = tar.with_suffix(".partial.tar")
        subprocess.run(
            [
                "mmdebstrap",
                "--mode=root",
                "--variant=minbase",
                "--skip=cleanup/apt/lists",
                "trixie",
                str(partial),
                SOURCES,
            ],
            check=True,
            capture_output=True,
            timeout=600,
        )
        partial.rename(tar)
    return tar


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trixie") / "root"
    root.mkdir()
    subprocess.run(["tar", "-xf", str(_tarball()), "-C", str(root)], check=True)
    yield root
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=True)


def chroot(root: Path, command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["chroot", str(root), "sh", "-c", command], capture_output=True, text=True, check=check, timeout=120
    )


def pyinfra_held(root: Path, tmp_path: Path, packages: list[str], present: bool) -> dict:
    deploy = tmp_path / "hold_deploy.py"
    deploy.write_text(
        "import json, os\n"
        "from roles.operations import apt_hold\n"
        "apt_hold.held(name='hold', packages=json.loads(os.environ['HOLD_PACKAGES']),\n"
        "              present=os.environ['HOLD_PRESENT'] == '1')\n"
    )
    env = dict(
        os.environ, HOLD_PACKAGES=json.dumps(packages), HOLD_PRESENT="1" if present else "0", PYTHONPATH=str(REPO)
    )
    out = subprocess.run(
        [str(REPO / ".venv" / "bin" / "pyinfra"), f"@chroot/{root}", str(deploy), "-y", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    start = out.stdout.index("{")
    return json.loads(out.stdout[start:])


def changed(result: dict) -> bool:
    """Whether pyinfra's --json results say the one operation changed the host."""
    (op,) = result["results"]["operations"]
    assert not op["error"], op
    return bool(op["success"]) and not op["no_change"]


def test_fact_reads_real_showhold(rootfs):
    chroot(rootfs, "apt-mark hold sed libc6:amd64 >/dev/null")
    out = chroot(rootfs, AptHeldPackages().command()).stdout.splitlines()
    assert AptHeldPackages.parse(out) == ["libc6", "sed"]
    chroot(rootfs, "apt-mark unhold sed libc6 >/dev/null")
    assert AptHeldPackages.parse(chroot(rootfs, "apt-mark showhold").stdout.splitlines()) == []


def test_held_through_pyinfra_converges(rootfs, tmp_path):
    first = pyinfra_held(rootfs, tmp_path, ["sed", "hostname"], True)
    assert chroot(rootfs, "apt-mark showhold").stdout.split() == ["hostname", "sed"]
    assert changed(first)
    second = pyinfra_held(rootfs, tmp_path, ["sed", "hostname"], True)
    assert not changed(second), second  # second run: no command at all
    # dpkg shows them as held (hi) for the DebPackages fact too
    assert {"sed", "hostname"} <= set(DebPackages().process(chroot(rootfs, "dpkg -l").stdout.splitlines()))
    released = pyinfra_held(rootfs, tmp_path, ["sed", "bash"], False)
    assert changed(released)
    assert chroot(rootfs, "apt-mark showhold").stdout.split() == ["hostname"]
    chroot(rootfs, "apt-mark unhold hostname >/dev/null")


def test_unknown_package_fails_the_hold(rootfs):
    res = chroot(rootfs, "apt-mark hold no-such-package-glm", check=False)
    assert res.returncode != 0 and "Unable to locate package" in res.stderr


@pytest.mark.parametrize("branch,priority", [("550", "1000"), ("580", "500")])
def test_driver_pin_read_by_apt(rootfs, branch, priority):
    (rootfs / driver_ops.PIN_FILE.lstrip("/")).write_text(driver_ops.pin_content(branch))
    try:
        res = chroot(rootfs, "apt-cache policy nvidia-driver libcuda1 firmware-nvidia-gsp nvidia-smi")
        assert not res.stderr.strip(), res.stderr  # apt accepts the file
        lines = [line.split() for line in res.stdout.splitlines()]
        versions = [parts for parts in lines if len(parts) == 2 and parts[0].startswith("550.")]
        assert versions and all(prio == priority for _, prio in versions), res.stdout
        # a package outside the pattern keeps its default priority
        other = chroot(rootfs, "apt-cache policy sed").stdout
        assert " 1000" not in other
    finally:
        (rootfs / driver_ops.PIN_FILE.lstrip("/")).unlink()


def _branch_check_command(package: str, branch: str) -> str:
    cmds = commands(
        driver_ops.driver_installed,
        {DebPackages: {}, Kernels: KernelState("6.12.38+deb13-amd64", ())},
        packages=[package],
        branch=branch,
    )
    assert cmds[-1].startswith("for p in")
    return cmds[-1]


def test_branch_check_after_install_runs(rootfs):
    sed_major = chroot(rootfs, "dpkg-query -W -f='${Version}' sed").stdout.split(".")[0]
    ok = chroot(rootfs, _branch_check_command("sed", sed_major), check=False)
    assert ok.returncode == 0, ok.stderr
    bad = chroot(rootfs, _branch_check_command("sed", str(int(sed_major) + 1)), check=False)
    assert bad.returncode == 1
    assert f"glm-flash: sed is not from driver branch {int(sed_major) + 1} after install" in bad.stderr


def _guard(package: str) -> str:
    cmds = commands(
        toolkit_ops.toolkit_installed,
        {DebPackages: {}, FileContents: None, AptVersions: ["12.8.1-1"]},
        cuda_version="12.8",
        tool="/x",
        runfile_url="https://x/cuda_12.8.1_1_linux.run",
        runfile_sha256="0" * 64,
    )
    return cmds[1].replace("cuda-toolkit-12-8", package)


def test_toolkit_guard_refuses_a_plan_with_driver_packages(rootfs):
    # Debian's nvidia-smi pulls libnvidia-ml1 and the driver's support packages.
    bad = chroot(rootfs, _guard("nvidia-smi"), check=False)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "would change driver packages" in bad.stderr and "nvidia-smi" in bad.stderr
    ok = chroot(rootfs, _guard("hostname"), check=False)  # reinstall plan without driver packages
    assert ok.returncode == 0, ok.stderr
