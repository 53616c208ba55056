"""The router's environment on the gateway: wheels chosen for the gateway's own python3.

roles/operations/gateway.py router_env_built reads the HostPython fact when it runs (a bare gateway
gets python3 earlier in the same run) and uploads the lock's wheels for that interpreter
(roles/fleet/gateway.py wheels_for, locks/gateway.txt hashes every platform's files), as the model
downloader's are chosen: an aarch64 gateway gets aarch64 wheels, not the x86_64 ones every gateway
got before. A python3 no wheel is built for refuses the gateway host, saying why, with nothing sent.
Real: the lock's wheels from PyPI (cached in ${GLM_FLASH_CACHE}/gateway-wheelhouse/<target>).
Simulated: the hosts (their facts are given to a fake host).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fakehost import F, FakeHost, on
from packaging.utils import parse_wheel_filename
from pyinfra.api import FileUploadCommand, FunctionCommand, OperationError, StringCommand
from pyinfra.facts.files import FileContents

from control.engine_lock import Target
from roles.facts.engine import WheelhouseFiles
from roles.facts.system import HostPython
from roles.fleet import gateway
from roles.operations.gateway import router_env_built

D = "/opt/glm-flash-gateway"
DEBIAN = {"implementation": "cpython", "version": "3.13", "platform": "linux-x86_64", "libc": "glibc 2.41", "bits": 64}
ARM = {**DEBIAN, "platform": "linux-aarch64"}


def planned(found, marker="", executing=False, have=None) -> list:
    fake = FakeHost(
        {
            F(FileContents, path=f"{D}/venv/{gateway.MARKER}"): [marker] if marker else None,
            HostPython: found,
            F(WheelhouseFiles, path=f"{D}/wheelhouse"): have or {},
        },
        name="gw.example.lan",
    )
    fake.state.is_executing = executing
    with on(fake):
        return list(
            router_env_built._inner(
                venv=f"{D}/venv",
                marker=gateway.MARKER,
                lock_sha="ab" * 32,
                wheelhouse=f"{D}/wheelhouse",
                wheels_for=gateway.wheels_for,
                commands=["build it"],
            )
        )


@pytest.mark.parametrize("found", [DEBIAN, ARM], ids=["x86_64", "aarch64"])
def test_the_gateway_gets_the_wheels_of_its_own_python3(found):
    machine = found["platform"].removeprefix("linux-")
    cmds = planned(found)
    uploads = [
        Path(c.dest).name.removeprefix(".").removesuffix(".glm-flash-new")
        for c in cmds
        if isinstance(c, FileUploadCommand)
    ]
    assert uploads and any(n.startswith("sglang_router-") for n in uploads), uploads
    platforms = {t.platform for n in uploads for t in parse_wheel_filename(n)[3]}
    assert any(p.endswith(machine) for p in platforms) and not any(
        p.endswith(("x86_64", "aarch64")) and not p.endswith(machine) for p in platforms
    ), platforms
    accepted = set(Target.of_interpreter(found).tags())
    assert all(set(parse_wheel_filename(n)[3]) & accepted for n in uploads)
    assert isinstance(cmds[-1], StringCommand) and cmds[-1].get_raw_value() == "build it"
    # each written whole: to a temporary name, then moved over its own (paths.replaced_whole)
    moves = [c.get_raw_value() for c in cmds if isinstance(c, StringCommand) and " mv -f -T " in c.get_raw_value()]
    assert len(moves) == len(uploads) and all(f"{D}/wheelhouse/{n}" in m for n, m in zip(uploads, moves))
    # a wheelhouse that holds them already: nothing uploaded again, the build still runs
    have = {
        n: Path(c.src).stat().st_size for n, c in zip(uploads, [c for c in cmds if isinstance(c, FileUploadCommand)])
    }
    assert [c.get_raw_value() for c in planned(found, have=have)] == ["build it"]


def test_built_from_this_lock_is_left_alone():
    assert planned(DEBIAN, marker="ab" * 32) == []


def test_a_python3_no_wheel_is_built_for_refuses_the_gateway():
    bad = {**DEBIAN, "libc": "musl 1.2"}
    with pytest.raises(OperationError, match="gw.example.lan: locks/gateway.txt: no wheels for the gateway's python3"):
        planned(bad)  # planned: refusal.host_refusals refuses the host before anything runs
    (cmd,) = planned(bad, executing=True)  # running: this host fails alone, nothing sent
    assert isinstance(cmd, FunctionCommand) and "musl 1.2" in cmd.args[0]
    assert planned(None) == []  # planned on a bare host: its python3 comes earlier in the run
    (cmd,) = planned(None, executing=True)
    assert isinstance(cmd, FunctionCommand) and "has no python3" in cmd.args[0]
