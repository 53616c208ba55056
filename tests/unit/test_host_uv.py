"""uv on the host: the one builder of its Python environments (roles/operations/python.py).

The executable is the uv of locks/tools.txt, taken from the wheel built for the machine the host's
own python3 says it runs on (the HostPython fact), not from `uname -m`. Checked here on the bytes the
operation uploads: an ELF for that machine, and (for this machine's x86_64) one that runs and says
it is the pinned version. A host without python3 while the run goes, one whose python3 no uv is built
for, and a cached wheel whose bytes are not the locked ones are refused, with nothing uploaded.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from fakehost import F, FakeHost, on
from pyinfra.api import FileUploadCommand, FunctionCommand
from pyinfra.facts.files import File, Sha256File

from control import engine_lock
from roles.facts.system import HostPython
from roles.operations import python

DEST = "/opt/glm-flash/tools/uv"
DGX_OS = {"implementation": "cpython", "version": "3.12", "platform": "linux-aarch64", "libc": "glibc 2.39", "bits": 64}
DEBIAN = {"implementation": "cpython", "version": "3.13", "platform": "linux-x86_64", "libc": "glibc 2.41", "bits": 64}
ELF_MACHINE = {"aarch64": 183, "x86_64": 62}  # e_machine: EM_AARCH64, EM_X86_64


def planned(found, executing=False) -> list:
    fake = FakeHost({HostPython: found, F(File, path=DEST): None})
    fake.state.is_executing = executing
    with on(fake):
        return list(python.uv_installed._inner(dest=DEST))


def uploaded(found) -> bytes:
    (upload,) = [c for c in planned(found) if isinstance(c, FileUploadCommand)]
    assert upload.dest == "/opt/glm-flash/tools/.uv.glm-flash-new"  # then moved over DEST whole
    return upload.src.getvalue()


def refused(found, executing=True) -> str:
    (command,) = planned(found, executing)
    assert isinstance(command, FunctionCommand) and command.function.__name__ == "_fail_this_host"
    return command.args[0]


def version() -> str:
    pin = engine_lock.pin_of(engine_lock.parse_lock(engine_lock.TOOLS_LOCK.read_text()), "uv")
    return pin.version


@pytest.mark.parametrize("found", [DGX_OS, DEBIAN], ids=["dgx-os-aarch64", "debian-x86_64"])
def test_the_uv_uploaded_is_built_for_the_machine_of_the_hosts_python3(found, tmp_path):
    data = uploaded(found)
    machine = found["platform"].removeprefix("linux-")
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == ELF_MACHINE[machine]
    commands = [str(c) for c in planned(found) if not isinstance(c, FileUploadCommand)]
    assert any("chmod 755" in c for c in commands) and any("root:root" in c for c in commands), commands
    assert (
        commands[-1].startswith("sync ") and f"mv -f -T /opt/glm-flash/tools/.uv.glm-flash-new {DEST}" in commands[-1]
    )
    if machine == "x86_64":  # this machine's: it runs, and is the pinned version
        exe = tmp_path / "uv"
        exe.write_bytes(data)
        exe.chmod(0o755)
        said = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
        assert said.split()[:2] == ["uv", version()]


def test_the_pinned_uv_already_there_is_left_alone():
    import hashlib

    data = uploaded(DEBIAN)
    there = {"user": "root", "group": "root", "mode": 755, "size": len(data)}
    fake = FakeHost(
        {HostPython: DEBIAN, F(File, path=DEST): there, F(Sha256File, path=DEST): hashlib.sha256(data).hexdigest()}
    )
    with on(fake):
        assert list(python.uv_installed._inner(dest=DEST)) == []
    assert fake.noops == [f"uv {DEST} is the pinned one"]
    other = FakeHost({**fake.facts, F(Sha256File, path=DEST): "0" * 64})  # another uv there: replaced
    with on(other):
        assert any(isinstance(c, FileUploadCommand) for c in python.uv_installed._inner(dest=DEST))


def test_a_host_uv_cannot_run_on_is_refused_and_gets_nothing():
    # planned on a bare host (no python3 until base_packages): nothing yet; running: refused
    assert planned(None) == []
    assert "has no python3" in refused(None)
    assert "no glibc" in refused({**DGX_OS, "libc": ""})
    assert "no manylinux wheels" in refused({**DGX_OS, "platform": "linux-riscv64"})


def test_a_cached_wheel_that_is_not_the_locked_one_is_refused(monkeypatch, tmp_path):
    """The cache's file is read once and hashed again on the bytes the executable comes from: a
    file changed after fetch checked it is refused."""
    (real,) = engine_lock.fetch(
        [engine_lock.pin_of(engine_lock.parse_lock(engine_lock.TOOLS_LOCK.read_text()), "uv")],
        dest=engine_lock.cache_root() / "host-tools",
        target=engine_lock.Target.of_interpreter(DEBIAN),
        wheels_only=True,
    )
    planted = tmp_path / real.name
    data = bytearray(real.read_bytes())
    data[len(data) // 2] ^= 0xFF
    planted.write_bytes(bytes(data))
    monkeypatch.setattr(engine_lock, "fetch", lambda *a, **k: [Path(planted)])
    engine_lock.host_uv.cache_clear()
    try:
        assert "none locks/tools.txt allows" in refused(DEBIAN)
    finally:
        engine_lock.host_uv.cache_clear()


def test_the_executable_is_known_by_its_record_line_and_held_against_it_when_unpacked():
    """A converged host is recognised by the sha256 the wheel's RECORD names (nothing unpacked);
    the bytes uploaded are held against that line: an executable that differs from it is refused."""
    import hashlib
    import io
    import zipfile

    uv = engine_lock.host_uv(engine_lock.Target.of_interpreter(DEBIAN))
    assert uv.sha256 == hashlib.sha256(uv.read()).hexdigest()
    buf = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(uv.wheel)) as z, zipfile.ZipFile(buf, "w") as out:
        for info in z.infolist():
            data = z.read(info)
            out.writestr(info.filename, data + b"\0" if info.filename == uv.member else data)
    changed = engine_lock.HostUv(buf.getvalue(), uv.member, uv.sha256)
    with pytest.raises(engine_lock.LockError, match="not the one its wheel's RECORD names"):
        changed.read()
    record = "a,sha256=x,1\n" + f"{uv.member},sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n"
    assert engine_lock._record_sha256(record, uv.member) == hashlib.sha256(b"").hexdigest()
    assert engine_lock._record_sha256(record, "other") is None
