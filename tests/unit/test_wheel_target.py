"""Every wheel the control machine sends to a host is chosen for that host's machine and Python.

The GB10 box is aarch64 with DGX OS's python3.12; the L40S box is x86_64 with Debian 13's python3.13.
The model downloader's wheels (files/hf-hub-requirements.txt) are installed on the host with
`pip install --no-index --only-binary :all:`, so a wheel for the other machine is no wheel at all
there: the deploy stops at the model role. Here a GB10 host is planned by deploy.py (recorded DGX OS
facts, tests/unit/test_gb10_plan.py) and an L40S host by the model role's choice, and each wheel
chosen must carry the host's machine tag and a Python tag the host's interpreter accepts; then pip's
own resolver, told the host's platform and Python, must install the lock from exactly those files.

Real wheels from PyPI (cached in ${GLM_FLASH_CACHE}/hf-hub-wheelhouse/<python>-<machine>); simulated:
the hosts (their `uname -m` and platform are facts given to a fake host).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import test_gb10_plan as gb10
from fakehost import FakeHost, on
from packaging.tags import Tag
from packaging.utils import parse_wheel_filename
from pyinfra.facts.server import Arch

from control.engine_lock import LockError, choose_file, manylinux_platforms, parse_lock, target_tags
from control.profile import HostRefused, build
from roles import model

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = (REPO / "files" / "hf-hub-requirements.txt").read_text()


def tags_of(path: str) -> frozenset[Tag]:
    return parse_wheel_filename(Path(path).name)[3]


def assert_for(wheels: list[str], py: str, arch: str) -> None:
    """Each wheel is for `arch` (or any machine) and for CPython `py`; the lock's every pin has one."""
    assert len(wheels) == len(parse_lock(REQUIREMENTS)), wheels
    accepted = set(target_tags(py, arch=arch))
    other = "x86_64" if arch == "aarch64" else "aarch64"
    for w in wheels:
        t = tags_of(w)
        assert t & accepted, f"{Path(w).name} is not installable by CPython {py} on {arch}"
        assert not any(other in tag.platform for tag in t), f"{Path(w).name} is for {other}"
    assert any(arch in tag.platform for w in wheels for tag in tags_of(w)), "no machine-specific wheel at all"


def pip_accepts(wheels: list[str], py: str, arch: str) -> subprocess.CompletedProcess:
    """pip's own resolution of the lock from these files only, for the host's Python and machine."""
    d = Path(wheels[0]).parent
    assert all(Path(w).parent == d for w in wheels)
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed", "--no-deps"]
        + ["--only-binary", ":all:", "--no-index", "--find-links", str(d), "--require-hashes"]
        + [a for platform in manylinux_platforms((2, 35), arch) for a in ("--platform", platform)]
        + ["--python-version", py, "--target", str(d / "never")]
        + ["-r", str(REPO / "files" / "hf-hub-requirements.txt")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"},
    )


def chosen_for(inventory: dict, arch: str) -> tuple[tuple[str, str], list[str]]:
    p = build("host.example.lan", inventory, api_key_present=False)
    with on(FakeHost({Arch: arch}, name="host.example.lan")):
        target = model.wheel_target(p)
        return target, model.downloader_wheels(REQUIREMENTS, *target)


def test_a_gb10_host_gets_aarch64_cp312_wheels_and_an_l40s_host_x86_64_cp313(monkeypatch):
    # The GB10, planned by deploy.py: the wheels the downloader's install operation uploads.
    plan, _ = gb10.run_deploy(monkeypatch, gb10.gb10_facts(), extra_facts_for=gb10.model_facts)
    (op,) = [c for c in plan.find("Model downloader") if c[0] == "downloader_installed"][:1]
    gb10_wheels = op[2]["wheels"]
    assert_for(gb10_wheels, "3.12", "aarch64")
    assert any(Path(w).name.startswith("hf_xet-") and "aarch64" in Path(w).name for w in gb10_wheels)
    # The L40S host: Debian 13's python3.13 on x86_64.
    target, l40s_wheels = chosen_for({"platform": "l40s"}, "x86_64")
    assert target == ("3.13", "x86_64")
    assert_for(l40s_wheels, "3.13", "x86_64")
    # pip itself, told each host's platform and Python, installs the lock from exactly those files,
    r = pip_accepts(gb10_wheels, "3.12", "aarch64")
    assert r.returncode == 0, r.stderr
    r = pip_accepts(l40s_wheels, "3.13", "x86_64")
    assert r.returncode == 0, r.stderr
    # and not from the other host's (what the GB10 box got before: x86_64 files).
    r = pip_accepts(l40s_wheels, "3.12", "aarch64")
    assert r.returncode != 0 and "from versions: none" in r.stderr + r.stdout


def test_a_cache_index_of_another_machine_is_not_trusted(tmp_path, monkeypatch):
    """One wheelhouse filled for x86_64, then asked for aarch64: the recorded x86_64 file is not handed out."""
    from control import engine_lock

    pins = [p for p in parse_lock(REQUIREMENTS) if p.name == "pyyaml"]
    x86 = engine_lock.fetch(pins, tmp_path, py="3.12", arch="x86_64")
    arm = engine_lock.fetch(pins, tmp_path, py="3.12", arch="aarch64")
    assert "x86_64" in x86[0].name and "aarch64" in arm[0].name


def test_unknown_machines_are_refused_before_anything_is_chosen(monkeypatch):
    from control import profile

    monkeypatch.setattr(profile, "HOST_ONLY", {"host.example.lan"})  # as deploy.py plans a host
    with pytest.raises(LockError, match="riscv64"):
        target_tags("3.12", arch="riscv64")
    p = build("host.example.lan", {"platform": "l40s"}, api_key_present=False)
    with on(FakeHost({Arch: "riscv64"}, name="host.example.lan")), pytest.raises(HostRefused) as e:
        model.wheel_target(p)
    assert "riscv64" in str(e.value) and "platform" in str(e.value)


def test_choose_file_picks_the_machine_asked_for():
    pin = parse_lock("pyyaml==6.0.4 --hash=sha256:" + "a" * 64 + " --hash=sha256:" + "b" * 64 + "\n")[0]
    files = [
        {"filename": "pyyaml-6.0.4-cp312-cp312-manylinux2014_x86_64.whl", "url": "u1", "hashes": {"sha256": "a" * 64}},
        {"filename": "pyyaml-6.0.4-cp312-cp312-manylinux2014_aarch64.whl", "url": "u2", "hashes": {"sha256": "b" * 64}},
    ]
    assert choose_file(pin, files, "3.12", arch="aarch64")["url"] == "u2"
    assert choose_file(pin, files, "3.12", arch="x86_64")["url"] == "u1"
    with pytest.raises(LockError, match="manylinux aarch64"):
        choose_file(pin, files[:1], "3.12", arch="aarch64")


def test_the_host_python_follows_the_platform_and_is_refused_elsewhere():
    assert (
        build(
            "h", {"platform": "gb10", "vllm_ref": gb10.REF, "accept_drafter_license": True}, api_key_present=False
        ).host_python_version
        == "3.12"
    )
    with pytest.raises(Exception, match="host_python_version"):
        build("h", {"platform": "l40s", "host_python_version": "3.12"}, api_key_present=False)
