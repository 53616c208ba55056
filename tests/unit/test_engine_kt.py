"""engine_kt decisions from host facts (what a run does, so a second run does nothing) and
the refusal of a lock that contradicts the profile; python role's packing rules."""

from __future__ import annotations

import os
import subprocess
import tarfile

import pytest
from fakehost import F, FakeHost, commands, on, render

from control.engine_lock import LockError
from control.profile import build
from control.python_pack import _included, pack
from roles.engines.kt.engine import plan
from roles.facts.engine import EngineEnvs, EngineState, WheelhouseFiles
from roles.operations import engine
from roles.operations.engine import pin_asserted

ENV = "0.7.0.post1-aaaaaaaaaaaa"
OLD = "0.7.2-bbbbbbbbbbbb"
CUDNN = "9.16.0.29"
TOOL = "/opt/glm-flash/bin/glm-flash-engine"


def st(current=None, complete=(), cudnn=None, owner=None):
    dists = {e: {"nvidia-cudnn-cu12": cudnn or CUDNN, "transformers-kt": "5.6.0.post3"} for e in complete}
    owners = {e: {"transformers": owner} for e in complete} if owner else {}
    return EngineState(current=current, complete=tuple(complete), present=tuple(complete), dists=dists, owners=owners)


def cudnn_cmds(state):
    return commands(pin_asserted, {EngineEnvs: state}, tool=TOOL, env=ENV, package="nvidia-cudnn-cu12", version=CUDNN)


def owner_cmds(state):
    return commands(
        pin_asserted,
        {EngineEnvs: state},
        tool=TOOL,
        env=ENV,
        package="transformers-kt",
        version="5.6.0.post3",
        owns="transformers",
    )


def built_cmds(state, build_argv=(TOOL, "build", ENV), **kw):
    return commands(
        engine.environment_built,
        {EngineEnvs: state, **kw.pop("facts", {})},
        tool=TOOL,
        env=ENV,
        build=list(build_argv),
        **kw,
    )


def switch_cmds(state):
    return commands(engine.current_engine, {EngineEnvs: state}, tool=TOOL, env=ENV)


@pytest.mark.parametrize(
    "state, built, switched",
    [
        (st(), True, True),  # bare host
        (st(current=OLD, complete=[OLD]), True, True),  # upgrade: build beside, then switch
        (st(current=ENV, complete=[ENV]), False, False),  # converged: nothing
        (st(current=OLD, complete=[OLD, ENV]), False, True),  # built earlier (e.g. after a rollback)
    ],
)
def test_environment_built_and_current_engine_read_the_host(state, built, switched):
    assert built_cmds(state) == ([f"{TOOL} build {ENV}"] if built else [])
    assert switch_cmds(state) == ([f"{TOOL} switch {ENV}", f"{TOOL} prune --keep {ENV}"] if switched else [])


def test_incomplete_env_is_rebuilt_not_switched_to_first():
    state = EngineState(current=OLD, complete=(OLD,), present=(OLD, ENV), dists={})
    assert built_cmds(state) == [f"{TOOL} build {ENV}"]


def test_build_uploads_only_the_wheels_the_host_lacks(tmp_path):
    a, b = tmp_path / "a-1-py3-none-any.whl", tmp_path / "b c-1-py3-none-any.whl"
    a.write_bytes(b"aa")
    b.write_bytes(b"bbb")
    wh = "/opt/glm-flash/engine/wheelhouse"
    got = built_cmds(
        st(),
        wheels=[str(a), str(b)],
        wheelhouse=wh,
        facts={F(WheelhouseFiles, path=wh): {a.name: 2, b.name: 1}},  # b truncated by an earlier upload
    )
    assert got == [f"upload {wh}/{b.name}\nbbb", f"{TOOL} build {ENV}"]


def test_the_build_runs_as_a_job_that_survives_the_connection():
    fake = FakeHost({EngineEnvs: st()})
    with on(fake):
        (command,) = engine.environment_built._inner(
            tool=TOOL,
            env=ENV,
            build=[TOOL, "build", ENV],
            wheelhouse="/r/engine/wheelhouse",
            job_tool="/r/bin/glm-flash-job",
        )
    assert render(command) == "function _follow"
    name, cmd = command.args
    assert name == "engine-build"
    assert cmd.get_raw_value() == (
        f"/r/bin/glm-flash-job run engine-build --every 30 --watch /r/engine -- {TOOL} build {ENV}"
    )


def test_commands_quote_what_comes_from_the_inventory():
    root = "/opt/glm flash;$(id)"
    got = commands(
        engine.environment_built,
        {EngineEnvs: st()},
        tool=f"{root}/bin/glm-flash-engine",
        env=ENV,
        build=[f"{root}/bin/glm-flash-engine", "build", ENV, "--python", f"{root}/python/x/bin/python3.11"],
    )
    assert got == [f"'{root}/bin/glm-flash-engine' build {ENV} --python '{root}/python/x/bin/python3.11'"]


@pytest.mark.parametrize(
    "state, cudnn, owner",
    [
        (st(current=ENV, complete=[ENV], owner="transformers-kt"), [], []),  # converged
        (st(), [], []),  # not built yet: the build installs both as locked
        (st(current=ENV, complete=[ENV], cudnn="9.10.2.21"), [f"{TOOL} assert-pin {ENV} nvidia-cudnn-cu12"], []),
        (
            st(current=ENV, complete=[ENV], owner="mixed"),
            [],
            [f"{TOOL} assert-pin {ENV} transformers-kt --force"],
        ),
    ],
)
def test_pins_asserted_from_the_host(state, cudnn, owner):
    assert cudnn_cmds(state) == cudnn
    assert owner_cmds(state) == owner


def test_a_drifted_pin_is_put_back_in_the_builds_sandbox_not_roots_session():
    """assert-pin runs the environment's own python (pip): what a build step dropped there (a .pth)
    runs too, so it is a glm-flash-job unit with root_job's properties, writing that environment only."""
    from roles.operations import sandboxing

    env_dir = f"/opt/glm-flash/engine/envs/{ENV}"
    fake = FakeHost({EngineEnvs: st(current=ENV, complete=[ENV], cudnn="9.10.2.21")})
    with on(fake):
        (command,) = engine.pin_asserted._inner(
            tool=TOOL,
            env=ENV,
            package="nvidia-cudnn-cu12",
            version=CUDNN,
            job_tool="/opt/glm-flash/bin/glm-flash-job",
            sandbox=sandboxing.root_job([env_dir]),
        )
    assert render(command) == "function _follow"
    name, cmd = command.args
    raw = cmd.get_raw_value()
    assert name == "engine-pin" and raw.startswith("/opt/glm-flash/bin/glm-flash-job run engine-pin ")
    assert raw.endswith(f" -- {TOOL} assert-pin {ENV} nvidia-cudnn-cu12")
    for prop in ("CapabilityBoundingSet=", f"ReadWritePaths={env_dir}", "PrivateNetwork=yes", "ProtectSystem=strict"):
        assert f"--property {prop} " in raw or f"--property '{prop}' " in raw, prop
    assert "ReadWritePaths=/opt/glm-flash/engine " not in raw


def test_converged_ops_say_why_they_do_nothing():
    fake = FakeHost({EngineEnvs: st(current=ENV, complete=[ENV], owner="transformers-kt")})
    with on(fake):
        assert [render(c) for c in engine.current_engine._inner(tool=TOOL, env=ENV)] == []
    assert fake.noops == [f"engine current is {ENV}"]


def test_plan_names_the_env_and_refuses_a_cudnn_the_lock_does_not_pin():
    p = build("h", {"require_gpu": False})
    env, pins = plan(p, "f" * 64)
    assert env.startswith("0.7.0.post1-") and len(env) == len("0.7.0.post1-") + 12
    assert plan(p, "e" * 64)[0] != env  # another interpreter: another env
    assert plan(build("h", {"require_gpu": False, "engine_set": "0.7.2"}), "f" * 64)[0].startswith("0.7.2-")
    with pytest.raises(LockError, match="cudnn_version is 9.10.2.21"):
        plan(build("h", {"require_gpu": False, "cudnn_version": "9.10.2.21"}), "f" * 64)


def test_python_pack_keeps_the_runtime_and_drops_the_rest():

    keep = [
        "bin/python3.11",
        "bin/python3",
        "lib/libpython3.11.so.1.0",
        "include/python3.11/Python.h",
        "lib/python3.11/os.py",
        "lib/python3.11/ensurepip/_bundled/pip-23.2.1-py3-none-any.whl",
        "lib/python3.11/lib-dynload/_ssl.cpython-311-x86_64-linux-gnu.so",
        "lib/python3.11/site-packages/README.txt",
    ]
    drop = [
        "bin/pip3",
        "bin/2to3",
        "bin/idle3",
        "lib/python3.11/site-packages/numpy/__init__.py",
        "lib/python3.11/test/test_os.py",
        "lib/python3.11/tkinter/__init__.py",
        "lib/python3.11/lib-dynload/_tkinter.cpython-311-x86_64-linux-gnu.so",
        "lib/python3.11/config-3.11-x86_64-linux-gnu/libpython3.11.a",
        "share/man/man1/python3.1",
    ]
    assert [r for r in keep if not _included(r, "3.11")] == []
    assert [r for r in drop if _included(r, "3.11")] == []


def test_pack_real_python_source_is_relocatable(tmp_path):
    """The sandbox inventory's python_source, packed and run from another directory."""

    source = os.environ.get("GLM_FLASH_PYTHON_SOURCE", "/root/.pyenv/versions/3.11.7")
    if not os.path.exists(f"{source}/bin/python3.11"):
        pytest.skip(f"not applicable: no CPython 3.11 tree at {source} on this machine")
    art = pack(source, "3.11")
    assert pack(source, "3.11") == art  # cached: same artifact
    with tarfile.open(art.path) as t:
        names = t.getnames()
        t.extractall(tmp_path / "py")
    assert "./bin/python3.11" in names and not any(
        "/site-packages/" in n and not n.endswith(("site-packages/", "README.txt")) for n in names
    )
    exe = tmp_path / "py" / "bin" / "python3.11"
    r = subprocess.run(
        [str(exe), "-I", "-c", "import sys, ssl, sqlite3, ctypes; print(sys.prefix)"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "py")
    runpath = subprocess.run(["readelf", "-d", str(exe)], capture_output=True, text=True).stdout
    assert "$ORIGIN/../lib" in runpath and source not in runpath


def test_a_packed_python_is_trusted_by_its_sha256_not_its_size(tmp_path):
    """The tarball the hosts get is the one packed: a cached file changed in place (same size),
    or one that others may have written, is packed again rather than uploaded."""
    import json as _json

    from control.pypi_cache import sha256_file
    from control.python_pack import PythonSourceError, _packed

    d = tmp_path / "python"
    d.mkdir(mode=0o755)
    tarball, meta = d / "cpython-3.11.7-abc.tar.gz", d / "cpython-3.11.7-abc.json"
    tarball.write_bytes(b"packed bytes" * 1000)
    meta.write_text(_json.dumps({"sha256": sha256_file(tarball), "size": tarball.stat().st_size}))
    for p in (tarball, meta):
        os.chmod(p, 0o644)
    info, said = {"version": "3.11.7", "prefix": "/x"}, []
    art = _packed(info, "cpython-3.11.7-abc", tarball, meta, said.append)
    assert art is not None and art.sha256 == sha256_file(tarball) and said == []
    tarball.write_bytes(b"PACKED bytes" * 1000)  # same size, other bytes
    assert _packed(info, "cpython-3.11.7-abc", tarball, meta, said.append) is None
    assert "is not the one recorded" in said[-1]
    tarball.write_bytes(b"packed bytes" * 1000)
    assert _packed(info, "cpython-3.11.7-abc", tarball, meta, said.append) is not None
    os.chmod(meta, 0o664)
    assert _packed(info, "cpython-3.11.7-abc", tarball, meta, said.append) is None
    assert "group or others may write it" in said[-1]
    os.chmod(meta, 0o644)
    os.chmod(d, 0o777)
    with pytest.raises(PythonSourceError, match="chmod go-w"):
        _packed(info, "cpython-3.11.7-abc", tarball, meta, said.append)


def test_a_converged_pack_runs_no_interpreter_and_hashes_nothing_it_recorded(tmp_path, monkeypatch):
    """A deploy that changes nothing asks for the packed CPython too: the tree is walked (its
    fingerprint), but neither run (its version and prefix are recorded by fingerprint) nor its
    tarball hashed again (the file whose hash was recorded: same size, inode, mtime and ctime).
    An edit to the tree, or to the tarball with its size and times put back, is still seen."""
    from control import python_pack
    from control.pypi_cache import sha256_file

    monkeypatch.setenv("GLM_FLASH_CACHE", str(tmp_path / "cache"))
    src, runs = tmp_path / "src", tmp_path / "runs"
    (src / "bin").mkdir(parents=True)
    (src / "lib" / "python3.11").mkdir(parents=True)
    exe = src / "bin" / "python3"  # stands in for the interpreter: says what _describe asks, counts its runs
    exe.write_text(
        f"#!/bin/sh\necho run >> {runs}\n"
        """echo '{"version": "3.11.7", "prefix": "/src", "impl": "cpython"}'\n"""
    )
    exe.chmod(0o755)
    (src / "lib" / "python3.11" / "os.py").write_text("x = 1\n")
    hashed = []
    monkeypatch.setattr(python_pack, "sha256_file", lambda p: hashed.append(p) or sha256_file(p))
    first = pack(src, "3.11")
    assert runs.read_text().split() == ["run"] and first.version == "3.11.7" and first.source_prefix == "/src"
    python_pack._HASHED.clear()  # as a new process
    hashed.clear()
    assert pack(src, "3.11") == first
    assert runs.read_text().split() == ["run"] and hashed == []
    # the tree changed: another fingerprint, run again, packed again
    (src / "lib" / "python3.11" / "os.py").write_text("x = 2\n")
    second = pack(src, "3.11")
    assert second.name != first.name and runs.read_text().split() == ["run", "run"]
    # the tarball changed in place, its size and times put back: hashed, found changed, packed again
    python_pack._HASHED.clear()
    hashed.clear()
    st = second.path.stat()
    data = bytearray(second.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    second.path.write_bytes(bytes(data))
    os.utime(second.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    third = pack(src, "3.11")
    assert hashed and third.sha256 == second.sha256 == sha256_file(second.path)


def test_the_artifacts_are_the_same_list_whether_the_interpreter_is_installed_or_not(tmp_path, monkeypatch):
    """A fleet's transfer list (roles/fleet/artifacts.py) is the engine's artifacts(): when it left out
    the CPython archive on a host that had it installed, a worker added later asked the fleet for a
    file nobody kept (issue 22). The archive is listed everywhere, 0644 (it is kept after unpacking)."""
    from types import SimpleNamespace

    from roles.engines.kt import engine as kt

    archive, wheel = tmp_path / "cpython.tar.gz", tmp_path / "w-1-py3-none-any.whl"
    archive.write_bytes(b"p")
    wheel.write_bytes(b"w")
    art = SimpleNamespace(path=archive, name="cpython-3.11.7-abc", sha256="a" * 64)
    monkeypatch.setattr(kt.interpreter, "artifact", lambda profile: art)
    monkeypatch.setattr(kt, "plan", lambda profile, sha: (None, ["pin"]))
    monkeypatch.setattr(kt, "fetch", lambda pins: [wheel])
    lists = []
    for installed in (None, "a" * 64):  # what the host's PythonArtifact fact would say
        monkeypatch.setattr(kt.memo, "fact", lambda *a, value=installed, **k: value, raising=False)
        lists.append([(u.rel, u.mode) for u in kt.artifacts(build("h", {}))])
    assert (
        lists[0]
        == lists[1]
        == [("python/.cpython-3.11.7-abc.tar.gz", "644"), (f"engine/wheelhouse/{wheel.name}", "644")]
    )
