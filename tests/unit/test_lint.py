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


def test_test_module_names_are_unique():
    """tests/*/ are not packages, so pytest imports each test module by its basename: two
    test_x.py in different folders stop the whole run at collection ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
