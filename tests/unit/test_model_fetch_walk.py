"""Root's walk of a checkpoint tree the downloader's user wrote (files/glm-flash-model-fetch).

`check` (every deploy: as the tree's owner, root for root's own tree) and `seal`/`unseal` (root)
read and chown a tree another user could fill while it was unsealed. Planted here, as that user could: a FIFO where a file should be (the
old tool's open() waited for a writer forever and hung the deploy), links to files outside the
tree (followed by the old tool), a directory of the tree swapped for a link, a sparse huge
marker (read whole into root's memory before). Each is refused within seconds, and nothing
outside the tree is read, changed or counted. The tool runs for real as root (a subprocess with
a timeout: a hang fails the test instead of stalling it).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from control import layout
from tests.conftest import host_tool, installed_tool, reachable_dir

FETCH = Path(layout.FILES) / "glm-flash-model-fetch"
NOBODY = 65534
TIMEOUT = 20  # seconds; the tool answers in well under one


@pytest.fixture(scope="module", autouse=True)
def installed():
    """The tool where any user may run it, as on a host (install_root/bin, 0755): started by root,
    `check` runs itself again as the tree's owner, who must reach it and the tree."""
    global FETCH
    with reachable_dir("glm-flash-walk-tool-") as top:
        FETCH = installed_tool(top, "glm-flash-model-fetch")
        yield


@pytest.fixture
def base():
    with reachable_dir("glm-flash-walk-") as top:
        yield top


def tool():
    return host_tool("glm-flash-model-fetch", "glm_flash_model_fetch")


def run(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, str(FETCH), *args], capture_output=True, text=True, timeout=TIMEOUT)
    return r, time.monotonic() - t0


def check(dest: Path) -> tuple[dict, float]:
    r, took = run("check", "--dest", str(dest), "--repo", "o/m", "--revision", "c" * 40)
    assert r.stdout, r.stderr
    return json.loads(r.stdout), took


@pytest.fixture
def tree(base):
    """A complete, verified checkpoint as a download leaves it (owned by the downloader: here nobody)."""
    dest = base / "model"
    (dest / "sub").mkdir(parents=True)
    files = {"config.json": b'{"a": 1}', "sub/shard-1.safetensors": b"x" * 1000}
    for name, data in files.items():
        (dest / name).write_bytes(data)
    (dest / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "sub/shard-1.safetensors"}}))
    mod = tool()
    entries = {n: {"lfs": False, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}
    entries["sub/shard-1.safetensors"]["lfs"] = True
    marker = {"format": mod.MARKER_FORMAT, "repo": "o/m", "revision": "c" * 40, "commit": "c" * 40, "files": entries}
    (dest / mod.MARKER).write_text(json.dumps(marker))
    for p in [dest, *dest.rglob("*")]:
        os.chown(p, NOBODY, NOBODY, follow_symlinks=False)
    return dest


@pytest.fixture
def outside(base):
    """A file and a directory outside the tree, root's, that nothing may read through or change."""
    d = base / "outside"
    d.mkdir()
    (d / "shard-1.safetensors").write_bytes(b"x" * 1000)
    (d / "secret").write_text("root only\n")
    os.chmod(d / "secret", 0o600)
    return d


def fingerprint(d: Path) -> dict:
    return {p: (os.lstat(p).st_uid, os.lstat(p).st_mode) for p in [d, *d.rglob("*")]}


def test_the_planted_tree_is_complete_as_it_is(tree):
    state, _ = check(tree)
    assert state["state"] == "complete" and not state["sealed"], state


@pytest.mark.parametrize("name", ["model.safetensors.index.json", ".glm-flash-model.json", "config.json"])
def test_a_fifo_in_place_of_a_file_is_refused_without_a_hang(tree, name):
    (tree / name).unlink()
    os.mkfifo(tree / name)
    state, took = check(tree)
    assert state["state"] == "incomplete" and took < TIMEOUT, state
    assert not state["sealed"]


def test_a_symlinked_directory_in_the_tree_is_not_followed(tree, outside):
    """sub/ swapped for a link to a directory holding a shard of the right size: the old tool
    counted it; it is missing now, and seal removes the link instead of chowning its target."""
    for p in (tree / "sub").iterdir():
        p.unlink()
    (tree / "sub").rmdir()
    (tree / "sub").symlink_to(outside)
    os.chown(tree / "sub", NOBODY, NOBODY, follow_symlinks=False)
    state, _ = check(tree)
    assert state["state"] == "incomplete" and "shard" in state["reason"], state
    before = fingerprint(outside)
    r, _ = run("seal", "--dest", str(tree))
    assert r.returncode == 0, r.stderr
    assert not (tree / "sub").exists() and not (tree / "sub").is_symlink()
    assert fingerprint(outside) == before


def test_a_link_to_a_file_outside_is_neither_read_nor_changed(tree, outside):
    (tree / "config.json").unlink()
    (tree / "config.json").symlink_to(outside / "secret")
    state, _ = check(tree)
    assert state["state"] == "incomplete" and "config.json" in state["reason"], state
    before = fingerprint(outside)
    r, _ = run("seal", "--dest", str(tree))
    assert r.returncode == 0, r.stderr
    assert fingerprint(outside) == before
    assert not (tree / "config.json").is_symlink()


def test_seal_removes_a_fifo_without_opening_it(tree):
    os.mkfifo(tree / "sub" / "pipe")
    r, took = run("seal", "--dest", str(tree))
    assert r.returncode == 0 and took < TIMEOUT, r.stderr
    assert not (tree / "sub" / "pipe").exists() and "not a file or directory" in r.stdout
    state, _ = check(tree)
    assert state == {**state, "state": "complete", "sealed": True}


def test_a_dest_reached_through_another_users_link_is_refused(base, tree):
    """A link on the way to dest, in a directory another user can write, is not followed."""
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    (theirs / "model").symlink_to(tree)
    state, _ = check(theirs / "model")
    assert state["state"] == "incomplete" and not state["sealed"], state
    r, _ = run("seal", "--dest", str(theirs / "model"))
    assert r.returncode != 0 and "symbolic link" in r.stderr, r.stderr
    assert os.lstat(tree).st_uid == NOBODY  # nothing sealed through it


def test_roots_own_link_to_dest_is_followed(base, tree):
    """An administrator's link (root's, in a directory only root writes) is a fine way to dest."""
    mine = base / "mine"
    mine.mkdir(mode=0o755)
    (mine / "model").symlink_to(tree)
    r, _ = run("seal", "--dest", str(mine / "model"))
    assert r.returncode == 0, r.stderr
    state, _ = check(mine / "model")
    assert state["state"] == "complete" and state["sealed"], state


def test_a_sparse_huge_marker_is_refused_unread(tree):
    marker = tree / tool().MARKER
    with open(marker, "r+b") as f:
        f.truncate(1 << 40)  # 1 TiB of holes: read whole, it exhausts root's memory
    state, took = check(tree)
    assert state["state"] == "incomplete" and took < TIMEOUT, state


def test_a_seal_cut_short_leaves_the_top_directory_the_downloaders(tree, monkeypatch):
    """The deploy checks a tree as the owner of its top directory (check_as_owner): seal makes the
    top root's last, so a seal that stops midway leaves a tree still checked as its user, never a
    root-owned top over files that user wrote."""
    mod = tool()
    calls = []

    def fchown(fd, uid, gid):
        calls.append(fd)
        if len(calls) == 3:
            raise OSError("cut short")
        os.chown(f"/proc/self/fd/{fd}", uid, gid)

    monkeypatch.setattr(mod.os, "fchown", fchown)
    with pytest.raises(OSError, match="cut short"):
        mod.seal(type("A", (), {"dest": str(tree), "owner": None})())
    assert os.stat(tree).st_uid == NOBODY
    assert any(os.lstat(p).st_uid == 0 for p in tree.rglob("*"))  # it did begin
    monkeypatch.undo()
    r, _ = run("seal", "--dest", str(tree))
    assert r.returncode == 0, r.stderr
    assert {os.lstat(p).st_uid for p in [tree, *tree.rglob("*")]} == {0}
