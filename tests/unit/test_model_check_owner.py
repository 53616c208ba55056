"""The checkpoint check runs as the user who owns the tree (roles/facts/model.py check_as_owner):
while the downloader's user owns it, root neither opens its files nor parses its JSON.

Real parts: the shell the deploy runs, this machine's setpriv (util-linux) and python3, the real
tool, a tree owned by `nobody` standing for the downloader's user (as root, as CI runs; the
sandbox's deploy runs the same command through the ModelCheck fact on every run)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
from pathlib import Path

import pytest

from roles.facts.model import check_as_owner
from tests.conftest import installed_tool, reachable_dir

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: it hands a tree to another user (CI runs as root)"
)


@pytest.fixture
def place():
    """A world-traversable directory with the tool (another user must reach both) and a tree."""
    with reachable_dir("glm-flash-owner-") as top:
        (top / "bin").mkdir(mode=0o755)
        tool = installed_tool(top / "bin", "glm-flash-model-fetch")
        tree = top / "model"
        tree.mkdir()
        (tree / "config.json").write_text("{}")
        (tree / "model.safetensors").write_text("w")
        yield tool, tree


def owned_by(tree: Path, user: str) -> None:
    pw = pwd.getpwnam(user)
    for path in [tree, *tree.rglob("*")]:
        os.chown(path, pw.pw_uid, pw.pw_gid)


def check(tool: Path, tree: Path, env: dict | None = None, hint: str = "") -> tuple[int, dict]:
    cmd = check_as_owner(str(tool), str(tree), hint=hint).get_raw_value()
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=env, cwd="/")
    check.stderr = r.stderr
    return r.returncode, json.loads(r.stdout)


def test_the_downloaders_tree_is_read_with_its_owners_rights_not_roots(place):
    tool, tree = place
    (tree / "config.json").chmod(0o000)  # root may read it; its owner may not
    assert check(tool, tree)[0] == 0  # root's tree: root's eyes
    owned_by(tree, "nobody")
    rc, out = check(tool, tree)
    assert rc == 1 and out["reason"].endswith("config.json is missing"), out
    (tree / "config.json").chmod(0o600)  # as the downloader writes its marker (mkstemp)
    rc, out = check(tool, tree)
    assert rc == 0 and out["state"] == "complete" and out["sealed"] is False, out


def test_nothing_in_the_callers_environment_is_imported_as_the_owner(place):
    tool, tree = place
    owned_by(tree, "nobody")
    planted = tree.parent / "planted"
    planted.mkdir(mode=0o777)
    (planted / "sitecustomize.py").write_text(f"open({str(planted / 'ran')!r}, 'w').write('steered')\n")
    (planted / "sitecustomize.py").chmod(0o644)
    rc, out = check(tool, tree, env={**os.environ, "PYTHONPATH": str(planted), "PYTHONSTARTUP": str(planted)})
    assert rc == 0, out
    assert not (planted / "ran").exists()


def test_a_failed_check_says_the_callers_hint_as_its_owner_too(place):
    """The deploy's hint (what to do) follows the tool's reason when the check fails, also when
    the check ran again as the tree's owner; a usable checkpoint says nothing."""
    tool, tree = place
    owned_by(tree, "nobody")
    hint = "glm-flash: copy the checkpoint there, or set model_download: true"
    assert check(tool, tree, hint=hint)[0] == 0 and check.stderr == ""
    (tree / "config.json").unlink()
    rc, out = check(tool, tree, hint=hint)
    assert rc == 1 and out["reason"].endswith("config.json is missing") and check.stderr == hint + "\n", check.stderr
