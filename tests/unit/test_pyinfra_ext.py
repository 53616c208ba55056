"""pyinfra_ext refuses to load on a pyinfra other than the one it was written against: each of its
modules, imported in a fresh interpreter whose pyinfra says another version, ends with the message
and without a traceback, before it replaced anything of pyinfra's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pyinfra

import pyinfra_ext

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(p.stem for p in (REPO / "pyinfra_ext").glob("*.py") if p.stem != "__init__")

PROBE = """
import sys
import pyinfra
pyinfra.__version__ = sys.argv[1]
from pyinfra.api import operations
original = operations._run_host_op_with_context
try:
    __import__("pyinfra_ext." + sys.argv[2])
except SystemExit as e:
    print("refused:", e.code)
else:
    print("loaded")
print("patched" if operations._run_host_op_with_context is not original else "untouched")
"""


def load(version: str, module: str) -> str:
    r = subprocess.run([sys.executable, "-c", PROBE, version, module], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_written_for_the_pinned_pyinfra():
    pin = re.search(r"^pyinfra==(\S+)", (REPO / "requirements.txt").read_text(), re.M)
    assert pin and pin[1] == pyinfra_ext.WRITTEN_FOR == pyinfra.__version__


def test_another_pyinfra_is_refused_with_a_clear_message():
    assert MODULES == ["host_args", "host_failures", "memo", "op_order", "refusal"]
    message = pyinfra_ext.mismatch("3.11.0")
    assert "pyinfra 3.11.0 is installed" in message and "pyinfra 3.10.0" in message and "make venv" in message
    for module in MODULES:
        out = load("3.11.0", module)
        assert out == f"refused: {message}\nuntouched\n", module


def test_the_pinned_pyinfra_loads():
    # the same probe on the pinned version: loads (host_failures then patches only when installed)
    assert load(pyinfra_ext.WRITTEN_FOR, "host_failures") == "loaded\nuntouched\n"
