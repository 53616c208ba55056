"""The model downloader's wheels are chosen for the host's own python3, as it describes itself.

The host installs them with `uv pip install --no-index --only-binary :all: --require-hashes` (the
pinned uv, roles/operations/python.py), so a wheel its installer does not accept is no wheel at all
there and the deploy stops at the model role. Where they
are chosen from is the HostPython fact (roles/facts/system.py): the interpreter's own version,
sysconfig platform, glibc and pointer size, the things pip's tags come from. Not `uname -m`: the
x86_64 GB10 sandbox answers aarch64 there, and its python3 (Debian's, x86_64) refused the aarch64
wheels that choice sent it.

Here deploy.py plans a GB10 box (recorded DGX OS facts, tests/unit/test_gb10_plan.py; its python3's
self-description from the public record: Ubuntu 24.04 arm64, python3 3.12, glibc 2.39) and the
wheels its downloader operation uploads must carry cp312 (or abi3/py3) and manylinux aarch64 tags,
and uv itself (the host's installer) and pip (a second reading of the same tag rules, for the glibc
2.41 uv's `--python-platform` has no name for), told that platform and Python, must install the
lock from exactly those files.
The L40S box (Debian 13's python3.13, x86_64) likewise. That the files really install and import
on an aarch64 userland: tests/gb10/test_downloader_arm64.py.

Real: the wheels from PyPI (cached in ${GLM_FLASH_CACHE}/hf-hub-wheelhouse/<target>), uv's and
pip's own resolvers. Simulated: the hosts (their facts are given to a fake host).
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
from pyinfra.api import OperationError

from control.engine_lock import LockError, Target, choose_file, fetch, manylinux_platforms, parse_lock, tools_bin
from roles import model
from roles.facts.system import HOST_PYTHON_SCRIPT, HostPython

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = (REPO / "files" / "hf-hub-requirements.txt").read_text()
DGX_OS = HostPython.parse((Path(__file__).parent / "data" / "gb10-python3.json").read_text().splitlines())
DEBIAN_13_X86 = {"implementation": "cpython", "version": "3.13", "platform": "linux-x86_64", "libc": "glibc 2.41"}
DEBIAN_13_X86["bits"] = 64


def tags_of(path: str) -> frozenset[Tag]:
    return parse_wheel_filename(Path(path).name)[3]


def assert_for(wheels: list[str], target: Target) -> None:
    """Each wheel installs on `target` and none is for another machine; every pin of the lock has one."""
    assert len(wheels) == len(parse_lock(REQUIREMENTS)), wheels
    accepted = set(target.tags())
    for w in wheels:
        t = tags_of(w)
        assert t & accepted, f"{Path(w).name} does not install on {target}"
        assert all(tag.platform == "any" or tag.platform.endswith(target.machine) for tag in t), Path(w).name
    assert any(target.machine in tag.platform for w in wheels for tag in tags_of(w)), "no machine's own wheel at all"


def pip_resolves(wheels: list[str], target: Target) -> subprocess.CompletedProcess:
    """pip's own resolution of the lock from these files only, told the target's platform and Python."""
    d = Path(wheels[0]).parent
    assert all(Path(w).parent == d for w in wheels)
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--disable-pip-version-check"]
        + ["--ignore-installed", "--no-deps"]
        + ["--only-binary", ":all:", "--no-index", "--find-links", str(d), "--require-hashes"]
        + [a for platform in manylinux_platforms(target.glibc, target.machine) for a in ("--platform", platform)]
        + ["--python-version", target.python, "--target", str(d / "never")]
        + ["-r", str(REPO / "files" / "hf-hub-requirements.txt")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PIP_CONFIG_FILE": "/dev/null"},
    )


def uv_resolves(wheels: list[str], target: Target) -> subprocess.CompletedProcess:
    """The pinned uv's own resolution of the lock from these files only, told the target's platform
    (its `--python-platform` names go up to manylinux_2_40) and Python."""
    d = Path(wheels[0]).parent
    return subprocess.run(
        [str(tools_bin() / "uv"), "pip", "install", "--dry-run", "--quiet", "--no-config", "--offline", "--no-cache"]
        + ["--no-deps", "--only-binary", ":all:", "--no-index", "--find-links", str(d), "--require-hashes"]
        + ["--python-platform", f"{target.machine}-manylinux_{target.glibc[0]}_{min(target.glibc[1], 40)}"]
        + ["--python-version", target.python, "--target", str(d / "never")]
        + ["-r", str(REPO / "files" / "hf-hub-requirements.txt")],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )


def chosen_for(found: dict) -> list[str]:
    with on(FakeHost({}, name="host.example.lan")):
        return model.downloader_wheels(REQUIREMENTS, found)


def test_the_gb10_plan_uploads_cp312_aarch64_wheels_pip_accepts_there(monkeypatch):
    dgx = Target.of_interpreter(DGX_OS)
    assert dgx == Target("3.12", "aarch64", (2, 39)) and dgx.name == "cp312-manylinux_2_39_aarch64"
    plan, _ = gb10.run_deploy(monkeypatch, gb10.gb10_facts(), extra_facts_for=gb10.model_facts)
    uploads = [
        c for c in plan.commands("Model downloader") if c.startswith("upload /opt/glm-flash/tools/hf-hub.wheels/")
    ]
    wheels = sorted({c.split("\n", 1)[0].rsplit("/", 1)[1] for c in uploads})
    house = model.cache_root() / "hf-hub-wheelhouse" / dgx.name
    assert_for([str(house / w) for w in wheels], dgx)
    assert any(w.startswith("hf_xet-") and w.endswith("_aarch64.whl") for w in wheels), wheels
    assert any(w.startswith("pyyaml-") and "-cp312-cp312-" in w and w.endswith("_aarch64.whl") for w in wheels)
    r = pip_resolves([str(house / w) for w in wheels], dgx)
    assert r.returncode == 0, r.stderr
    r = uv_resolves([str(house / w) for w in wheels], dgx)
    assert r.returncode == 0, r.stderr


def test_a_host_is_sent_what_its_python3_installs_whatever_uname_says():
    """The L40S box's python3.13 on x86_64 gets x86_64 cp313 files; so does the GB10 sandbox, whose
    `uname -m` says aarch64 and whose python3 is Debian's x86_64 one. The old choice (x86_64 for
    everyone) is what DGX OS's pip refuses: shown by pip itself."""
    x86 = Target.of_interpreter(DEBIAN_13_X86)
    wheels = chosen_for(DEBIAN_13_X86)
    assert_for(wheels, x86)
    assert pip_resolves(wheels, x86).returncode == 0
    r = pip_resolves(wheels, Target.of_interpreter(DGX_OS))
    assert r.returncode != 0 and "from versions: none" in r.stderr + r.stdout
    r = uv_resolves(wheels, Target.of_interpreter(DGX_OS))
    assert r.returncode != 0 and "has no wheels with a matching platform tag" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "found, why",
    [
        ({**DGX_OS, "implementation": "pypy"}, "its python3 is pypy, not CPython"),
        ({**DGX_OS, "libc": ""}, "no glibc"),
        ({**DGX_OS, "libc": "musl 1.2"}, "musl 1.2"),
        ({**DGX_OS, "bits": 32}, "32-bit build on a aarch64 machine"),
        ({**DGX_OS, "platform": "linux-riscv64"}, "'linux-riscv64', for which no manylinux wheels are built"),
        ({**DGX_OS, "platform": "macosx-14.0-arm64"}, "no manylinux wheels"),
        (HostPython.parse(["Traceback (most recent call last):", "SyntaxError: invalid syntax"]), "printed 'Traceback"),
    ],
)
def test_a_python3_no_wheel_is_chosen_for_refuses_the_host_saying_why(found, why):
    with pytest.raises(OperationError) as e:
        chosen_for(found)
    assert "host.example.lan: model_download: no wheels can be chosen for the host's python3" in str(e.value)
    assert why in str(e.value) and "Fix:" in str(e.value)


def test_a_lock_without_a_wheel_for_the_target_is_refused_not_sent_as_an_sdist():
    pin = parse_lock("pyyaml==6.0.4 --hash=sha256:" + "a" * 64 + " --hash=sha256:" + "b" * 64 + "\n")[0]
    files = [
        {"filename": "pyyaml-6.0.4-cp312-cp312-manylinux2014_x86_64.whl", "url": "u1", "hashes": {"sha256": "a" * 64}},
        {"filename": "pyyaml-6.0.4-cp312-cp312-manylinux2014_aarch64.whl", "url": "u2", "hashes": {"sha256": "b" * 64}},
        {"filename": "pyyaml-6.0.4.tar.gz", "url": "u3", "hashes": {"sha256": "b" * 64}},
    ]
    arm = Target("3.12", "aarch64", (2, 39))
    assert choose_file(pin, files, target=arm)["url"] == "u2"
    assert choose_file(pin, files, target=Target("3.12", "x86_64", (2, 39)))["url"] == "u1"
    assert choose_file(pin, files[:1] + files[2:], target=arm)["url"] == "u3"  # the engine's way: the sdist
    with pytest.raises(LockError, match=r"no wheel with a locked hash installs on CPython 3.12 on aarch64"):
        choose_file(pin, files[:1] + files[2:], target=arm, wheels_only=True)
    # a wheel for a newer glibc than the host's is not taken
    newer = [{**files[1], "filename": "pyyaml-6.0.4-cp312-cp312-manylinux_2_41_aarch64.whl"}]
    with pytest.raises(LockError):
        choose_file(pin, newer, target=arm, wheels_only=True)


def test_a_cache_index_of_another_target_is_not_trusted(tmp_path):
    """One wheelhouse filled for x86_64, then asked for aarch64: the x86_64 file it recorded is not handed out."""
    pins = [p for p in parse_lock(REQUIREMENTS) if p.name == "pyyaml"]
    x86 = fetch(pins, tmp_path, target=Target("3.12", "x86_64", (2, 39)), wheels_only=True)
    arm = fetch(pins, tmp_path, target=Target("3.12", "aarch64", (2, 39)), wheels_only=True)
    assert "x86_64" in x86[0].name and "aarch64" in arm[0].name


def test_the_fact_is_what_this_machines_python_says_of_itself():
    """The fact's script, run by a real interpreter (this one), parsed as the deploy parses it."""
    out = subprocess.run([sys.executable, "-I", "-c", HOST_PYTHON_SCRIPT], capture_output=True, text=True, check=True)
    found = HostPython.parse(out.stdout.splitlines())
    import platform
    import sysconfig

    assert found["version"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert found["platform"] == sysconfig.get_platform() and found["libc"] == " ".join(platform.libc_ver())
    assert Target.of_interpreter(found).machine == platform.machine()
    assert HostPython.parse(["missing"]) is None
