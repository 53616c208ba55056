"""The example inventories as a new user fills them in (shared by the first-contact tests)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REF = "0123456789abcdef0123456789abcdef01234567"


def user_home(tmp_path: Path) -> Path:
    """A HOME with an SSH key, as a user who followed the README has one."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    key = home / ".ssh" / "id_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return home


def filled(example: str, tmp_path: Path, **replace: str) -> Path:
    """inventory/<example> with its placeholders replaced as the README says, copied where the
    README puts it (inventory/local/, known_hosts beside it) in a checkout's layout under tmp_path."""
    text = (REPO / "inventory" / example).read_text()
    text = text.replace("example.lan", "lan").replace("0" * 40, REF)
    text = text.replace('"accept_drafter_license": False', '"accept_drafter_license": True')
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    work = tmp_path / "checkout"
    (work / "inventory" / "local").mkdir(parents=True, exist_ok=True)
    (work / "inventory" / "local" / "known_hosts").write_text("gpu1.lan ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMm\n")
    path = work / "inventory" / "local" / example
    path.write_text(text)
    return path


def load(inventory: Path, home: Path, *, pyinfra: bool = False) -> subprocess.CompletedProcess:
    """Load an inventory as pyinfra does (from the checkout), or run the real pyinfra CLI on it."""
    env = dict(os.environ, HOME=str(home), PYTHONPATH=str(REPO))
    env.pop("GLM_FLASH_API_KEY", None)
    if pyinfra:
        cmd = [sys.executable, "-m", "pyinfra", "-y", str(inventory), str(REPO / "deploy.py")]
    else:
        cmd = [sys.executable, "-c", "import runpy, sys; runpy.run_path(sys.argv[1])", str(inventory)]
    checkout = next(p.parent for p in inventory.parents if p.name == "inventory")
    return subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=120)
