"""The linter and the formatter, configured once in ruff.toml, over the whole repo."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_check_finds_nothing():
    r = ruff("check", "--no-cache", ".")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format_changes_nothing():
    r = ruff("format", "--no-cache", "--check", ".")
    assert r.returncode == 0, r.stdout + r.stderr
