"""The engine interpreter and environment on a deployed L40S host (sandbox or real):
versions and file hashes as locked, cuDNN over torch's pin, transformers-kt owning
transformers/, Python 3.11, `current` pointing at a complete environment.

    pytest tests/host/test_engine_env.py --inventory inventory/l40s.py --hosts ssh://root@gpu1
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from control.engine_lock import load_lock, lock_json

pytestmark = pytest.mark.usefixtures("_l40s_only")


@pytest.fixture
def _l40s_only(profile):
    if profile.platform != "l40s":
        pytest.skip("not applicable: KTransformers runs on the L40S platform only")


@pytest.fixture(scope="module")
def engine(profile):
    return f"{profile.install_root}/engine"


@pytest.fixture(scope="module")
def current_env(host, profile, engine) -> str:
    target = host.run(f"readlink {engine}/current")
    assert target.rc == 0, f"{engine}/current is not a symlink"
    return target.stdout.strip().rsplit("/", 1)[-1]


@pytest.fixture(scope="module")
def pins(profile):
    return {p.name: p for p in load_lock(profile.engine_set)[1]}


@pytest.fixture(scope="module")
def report(host, profile, current_env):
    """The host tool's own check of the current env, hashing every installed file (--full)."""
    r = host.run(f"{profile.install_root}/bin/glm-flash-engine verify {shlex.quote(current_env)} --full --json")
    assert r.stdout.strip(), r.stderr
    return json.loads(r.stdout)


def test_current_points_at_a_complete_env_of_the_profiles_set(host, profile, engine, current_env):
    assert current_env.startswith(profile.engine_set + "-"), (
        f"current is {current_env}, profile wants {profile.engine_set}"
    )
    assert host.file(f"{engine}/envs/{current_env}/.glm-flash-complete").is_file
    marker = json.loads(host.file(f"{engine}/envs/{current_env}/.glm-flash-complete").content_string)
    assert marker["env"] == current_env
    # the lock the env was built from is the repo's lock for this set, as the control machine parsed it
    uploaded = host.file(f"{engine}/locks/{current_env}.json")
    assert uploaded.content_string == lock_json(load_lock(profile.engine_set)[1])
    assert uploaded.sha256sum == marker["lock_sha256"]


def test_python_version(host, profile, engine):
    r = host.run(f"{engine}/current/bin/python -I -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])'")
    assert r.rc == 0, r.stderr
    assert r.stdout.strip() == profile.python_version


def test_every_locked_package_is_installed_at_its_version(report, pins):
    assert {n: report["versions"].get(n) for n in pins} == {n: p.version for n, p in pins.items()}
    extra = set(report["versions"]) - set(pins) - {"pip", "setuptools"}
    assert not extra, f"installed but not locked: {sorted(extra)}"


def test_installed_files_match_their_records(report):
    """RECORD hashes of every installed file, patched files accounted for by the patch manifests."""
    assert report["problems"] == []
    assert report["complete"] is True


def test_cudnn_is_the_profiles_version(report, profile):
    assert report["cudnn"] == profile.cudnn_version


def test_transformers_kt_owns_transformers(report, pins):
    if "transformers-kt" not in pins:
        pytest.skip("not applicable: this set has no transformers-kt")
    assert report["owners"]["transformers"]["owner"] == "transformers-kt"
    assert report["owners"]["transformers"]["files_not_from_owner"] == 0


def test_wheelhouse_files_carry_locked_hashes(host, profile, engine, pins):
    """pip installed with --require-hashes from these files; they must still be the locked ones."""
    r = host.run(f"cd {engine}/wheelhouse && sha256sum -- *")
    assert r.rc == 0, r.stderr
    by_pin: dict[str, list[str]] = {}
    for line in r.stdout.splitlines():
        digest, filename = line.split(maxsplit=1)
        filename = filename.lstrip("*")
        if filename.endswith(".whl"):
            name, version, _, _ = parse_wheel_filename(filename)
        else:
            name, version = parse_sdist_filename(filename)
        by_pin.setdefault(f"{canonicalize_name(name)}=={version}", []).append(digest)
    for name, pin in pins.items():
        digests = by_pin.get(f"{name}=={Version(pin.version)}")
        assert digests, f"{name}=={pin.version}: no file in the wheelhouse"
        assert any(d in pin.hashes for d in digests), f"{name}=={pin.version}: wheelhouse file hash is not locked"


def test_rollback_command_is_installed(host, profile):
    for path in (f"{profile.install_root}/bin/glm-flash-rollback", "/usr/local/sbin/glm-flash-rollback"):
        assert host.file(path).linked_to == f"{profile.install_root}/bin/glm-flash-engine"
    assert host.run("glm-flash-rollback --help").rc == 0


def _lock_file_pins(engine_set: str) -> dict[str, str]:
    """locks/engine/<set>.txt read as pip reads a requirements file (`name==version \\`), not
    through control.engine_lock: the committed file is the independent source here."""
    text = (Path(__file__).resolve().parents[2] / "locks" / "engine" / f"{engine_set}.txt").read_text()
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, flags=re.M)
    assert pins, f"no pins read from locks/engine/{engine_set}.txt"
    return {canonicalize_name(n): v for n, v in pins}


# stdlib only, on the host: what the environment's own interpreter finds installed
_INSTALLED = (
    "import importlib.metadata as m, json; "
    "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
)


def test_installed_versions_are_the_lock_files_by_the_hosts_own_metadata(host, engine, profile):
    """Independent of glm-flash-engine verify: importlib.metadata of the env's python against the
    lock file text, and the installer's own `uv pip check` (README: the cuDNN pin over torch's is its one
    conflict), with the deploy's uv (install_root/tools/uv)."""
    r = host.run(f"cd /tmp && {engine}/current/bin/python -I -c {shlex.quote(_INSTALLED)}")
    assert r.rc == 0, r.stderr
    installed = {canonicalize_name(n): v for n, v in json.loads(r.stdout).items()}
    locked = _lock_file_pins(profile.engine_set)
    wrong = {
        n: (installed.get(n), v)
        for n, v in locked.items()
        if installed.get(n) is None or Version(installed[n]) != Version(v)
    }
    assert not wrong, f"installed vs locked: {wrong}"
    assert set(installed) - set(locked) <= {"pip", "setuptools"}, sorted(set(installed) - set(locked))
    uv = f"{profile.install_root}/tools/uv"
    check = host.run(f"cd /tmp && {uv} pip check --no-config --python {engine}/current/bin/python")
    # uv says it on stderr: "The package `torch` requires `nvidia-cudnn-cu12==9.10.2.21 ; ...`, but
    # `9.16.0.29` is installed"
    lines = [line for line in check.stderr.splitlines() if line.startswith("The package `")]
    # The field report's versions over the set's own pins, as the lock's header names them
    # (docs/sources.md §2: transformers-kt 5.6.0.post4 over sglang-kt 0.7.0.post1's post3).
    lock = (Path(__file__).resolve().parents[2] / "locks" / "engine" / f"{profile.engine_set}.txt").read_text()
    field = re.findall(r"^# (\S+) overridden to (\S+), the version the field report ran", lock, flags=re.M)
    assert check.rc == 1 and len(lines) == 1 + len(field), check.stderr
    # L40S field report, "Patches needed on sm_89": nvidia-cudnn-cu12==9.16.0.29 over torch 2.9.1's pin
    cudnn = [line for line in lines if line.startswith("The package `torch` ")]
    assert len(cudnn) == 1 and "`nvidia-cudnn-cu12==" in cudnn[0] and "but `9.16.0.29` is" in cudnn[0], check.stderr
    for name, version in field:
        assert any(f"requires `{name}==" in line and f"but `{version}` is installed" in line for line in lines), (
            check.stderr
        )
