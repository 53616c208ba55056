"""pyinfra's command line sets sys.dont_write_bytecode for the deploy's imports; control/__init__.py
gives this repo's modules their byte code back, unless the user turned it off (-B,
PYTHONDONTWRITEBYTECODE)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

AS_PYINFRA = "import sys; sys.dont_write_bytecode = True; import control; print(sys.dont_write_bytecode)"


def said(*flags: str, env: dict | None = None) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    r = subprocess.run(
        [sys.executable, *flags, "-c", AS_PYINFRA],
        cwd=REPO,
        env={**clean, **(env or {})},
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_the_repos_modules_get_byte_code_under_pyinfra():
    assert said() == "False"


def test_a_user_who_turned_byte_code_off_keeps_it_off():
    assert said("-B") == "True"
    assert said(env={"PYTHONDONTWRITEBYTECODE": "1"}) == "True"
