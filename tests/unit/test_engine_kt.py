"""engine_kt decisions from host facts (what a run does, so a second run does nothing) and
the refusal of a lock that contradicts the profile; python role's packing rules."""

from __future__ import annotations

import pytest

from control.engine_lock import LockError
from control.profile import build
from roles.engine_kt import decide, plan
from roles.facts.engine import EngineState

ENV = "0.7.0.post1-aaaaaaaaaaaa"
OLD = "0.7.2-bbbbbbbbbbbb"
CUDNN = "9.16.0.29"


def st(current=None, complete=(), cudnn=None):
    dists = {e: {"nvidia-cudnn-cu12": cudnn or CUDNN} for e in complete}
    return EngineState(current=current, complete=tuple(complete), present=tuple(complete), dists=dists)


@pytest.mark.parametrize(
    "state, owner, expected",
    [
        (st(), None, ["build", "switch"]),  # bare host
        (st(current=OLD, complete=[OLD]), None, ["build", "switch"]),  # upgrade: build beside, then switch
        (st(current=ENV, complete=[ENV]), True, []),  # converged: nothing
        (st(current=ENV, complete=[ENV]), None, []),  # a set without transformers-kt
        (st(current=ENV, complete=[ENV], cudnn="9.10.2.21"), True, ["assert-cudnn"]),
        (st(current=ENV, complete=[ENV]), False, ["assert-owner"]),
        (st(current=OLD, complete=[OLD, ENV]), True, ["switch"]),  # built earlier (e.g. after a rollback)
        (st(current=OLD, complete=[OLD, ENV], cudnn="9.10.2.21"), True, ["assert-cudnn", "switch"]),
    ],
)
def test_decide(state, owner, expected):
    assert decide(state, ENV, CUDNN, owner) == expected


def test_incomplete_env_is_rebuilt_not_switched_to_first():
    state = EngineState(current=OLD, complete=(OLD,), present=(OLD, ENV), dists={})
    assert decide(state, ENV, CUDNN) == ["build", "switch"]


def test_plan_names_the_env_and_refuses_a_cudnn_the_lock_does_not_pin():
    p = build("h", {"require_gpu": False})
    env, _, pins = plan(p, "f" * 64)
    assert env.startswith("0.7.0.post1-") and len(env) == len("0.7.0.post1-") + 12
    assert plan(p, "e" * 64)[0] != env  # another interpreter: another env
    assert plan(build("h", {"require_gpu": False, "engine_set": "0.7.2"}), "f" * 64)[0].startswith("0.7.2-")
    with pytest.raises(LockError, match="cudnn_version is 9.10.2.21"):
        plan(build("h", {"require_gpu": False, "cudnn_version": "9.10.2.21"}), "f" * 64)


def test_python_pack_keeps_the_runtime_and_drops_the_rest():
    from roles.python import _included

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
    import os
    import subprocess
    import tarfile

    from roles.python import pack

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
