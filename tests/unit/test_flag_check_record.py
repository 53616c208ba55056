"""glm-flash-check-flags answers a converged deploy from root's record instead of importing the engine.

The engine here is a stand-in `sglang` package in a throwaway venv (the real one needs the
sandbox: tests/sandbox/test_flag_check.py): its server_args module counts its imports in a file,
so a test sees whether the parser was built or the record answered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "files/glm-flash-check-flags"
SPEC = {"module": "sglang.launch_server", "args": ["--port", "30000"], "api_key_flag": "--api-key"}

SERVER_ARGS = """
import os
with open(os.environ["IMPORTS"], "a") as f:
    f.write("x")


class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--port", type=int)
        parser.add_argument("--api-key")
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="not applicable: records are root's only")


@pytest.fixture
def engine(tmp_path):
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin/python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    pkg = Path(purelib) / "sglang/srt"
    pkg.mkdir(parents=True)
    for d in (pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "server_args.py").write_text(SERVER_ARGS)
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    os.chmod(tmp_path, 0o755)
    return {"python": python, "server_args": pkg / "server_args.py", "imports": tmp_path / "imports", "state": state}


def check(engine, spec=SPEC, record_dir=None):
    record_dir = record_dir or engine["state"] / "flag-checks"
    return subprocess.run(
        [engine["python"], TOOL, "--args-json", json.dumps(spec), "--record-dir", str(record_dir)],
        capture_output=True,
        text=True,
        # As on a host: the engine's import writes its byte code (a test runner may turn that off).
        env={
            **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
            "IMPORTS": str(engine["imports"]),
        },
    )


def imports(engine) -> int:
    return len(engine["imports"].read_text()) if engine["imports"].exists() else 0


def test_second_check_of_the_same_engine_and_flags_answers_from_the_record(engine):
    first = check(engine)
    assert first.returncode == 0 and imports(engine) == 1, first.stderr
    records = list((engine["state"] / "flag-checks").iterdir())
    assert len(records) == 1 and records[0].stat().st_mode & 0o777 == 0o644
    second = check(engine)
    assert second.returncode == 0 and "recorded" in second.stdout
    assert imports(engine) == 1  # the engine was not imported again
    # the first check's import wrote byte code beside the engine's files; it is not part of the key
    assert list(engine["server_args"].parent.glob("__pycache__/server_args.*.pyc"))


def test_a_changed_engine_file_or_flag_is_checked_again(engine):
    assert check(engine).returncode == 0
    os.utime(engine["server_args"], ns=(1, 1))  # the file changed (a patch, a reinstall)
    assert check(engine).returncode == 0 and imports(engine) == 2
    other = dict(SPEC, args=["--port", "30001"])
    assert check(engine, other).returncode == 0 and imports(engine) == 3


def test_bytes_rewritten_in_place_with_the_mtime_put_back_are_checked_again(engine):
    assert check(engine).returncode == 0
    path, st = engine["server_args"], engine["server_args"].stat()
    text = path.read_text()
    path.write_text(text.replace("--port", "--pork"))  # same size, same inode
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = check(engine)
    assert "recorded" not in r.stdout and imports(engine) == 2  # imported again, not the record's answer


def test_refused_flags_leave_no_record(engine):
    bad = dict(SPEC, args=["--port", "not-a-number"])
    assert check(engine, bad).returncode == 1
    assert check(engine, bad).returncode == 1 and imports(engine) == 2
    assert not any((engine["state"] / "flag-checks").iterdir())


@pytest.mark.parametrize("kind", ["link", "writable"])
def test_a_record_directory_someone_else_could_change_is_not_trusted(engine, kind):
    real = engine["state"] / "flag-checks"
    assert check(engine).returncode == 0  # a record exists in the real directory
    if kind == "link":
        target = engine["state"] / "link"
        target.symlink_to(real)
    else:
        target = real
        os.chmod(real, 0o777)
    r = check(engine, record_dir=target)
    assert r.returncode == 0 and "recorded" not in r.stdout and imports(engine) == 2


def test_the_key_covers_only_the_engine_package(engine):
    """The record names the engine's own files: a file beside the package does not matter."""
    assert check(engine).returncode == 0
    (engine["server_args"].parents[2] / "unrelated.py").write_text("")
    assert check(engine).returncode == 0 and imports(engine) == 1
