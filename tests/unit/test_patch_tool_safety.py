"""files/glm-flash-patch against a hostile non-root user, and killed between its writes.

The real tool runs as a subprocess (as root, like on a host) on files in a temp dir. The
"other user" is `nobody` (uid 65534): links and directories are handed to it with lchown/chown,
which is what a planted link or a service-writable directory looks like to root. A canary file
stands for a root file (/etc/shadow) the links point at: it must never change.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_cuda_header_role import run_hook

from tests.unit.test_cuda_header_role import fact_output
from tests.unit.test_patch_tool import other_set, text_set

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "files" / "glm-flash-patch"
NOBODY = 65534
ORIGINAL = "a = 0\nx = 1\ny = 3\n"
OTHER = "import os\nflag = True\n"  # the file other_set edits (tests/unit/test_patch_tool.py)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="hands files to another user (lchown): needs root")


def sha(p) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def run(state, action, *sets, extra=(), **env):
    return subprocess.run(
        [sys.executable, str(TOOL), action, *map(str, sets), *extra],
        env=dict(os.environ, GLM_FLASH_STATE_DIR=str(state), **env),
        capture_output=True,
        text=True,
    )


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.py").write_text(ORIGINAL)
    (root / "b.py").write_text(OTHER)
    return root


@pytest.fixture
def canary(tmp_path):
    """A root-owned file the planted links point at; it looks like a file the set would patch."""
    c = tmp_path / "canary"
    c.write_text(ORIGINAL)
    c.chmod(0o600)
    return c


def fingerprint(p: Path):
    st = p.stat()
    return sha(p), st.st_mode, st.st_uid, st.st_gid


def planted_link(link: Path, target: Path, uid: int = NOBODY) -> None:
    link.symlink_to(target)
    os.lchown(link, uid, uid)


def test_target_that_is_a_link_is_refused(tmp_path, tree, canary):
    (tree / "a.py").unlink()
    planted_link(tree / "a.py", canary, uid=0)  # even root's own link: the file itself is never a link
    before = fingerprint(canary)
    r = run(tmp_path / "state", "apply", text_set(tmp_path, tree))
    assert r.returncode == 2 and "is a symbolic link" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert fingerprint(canary) == before
    assert not (tmp_path / "state").exists()


def test_directory_link_planted_by_another_user_is_refused(tmp_path, tree):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "a.py").write_text(ORIGINAL)
    planted_link(tree / "sub", elsewhere)
    s = tmp_path / "sub.json"
    s.write_text(
        json.dumps(
            {
                "name": "sub",
                "root": str(tree / "sub"),
                "files": [{"path": "a.py", "edits": [{"id": "x", "anchor": "x = 1\n", "replace": "x = 2\n"}]}],
            }
        )
    )
    r = run(tmp_path / "state", "apply", s)
    assert r.returncode == 2 and f"{tree}/sub is a symbolic link another user could have planted" in r.stderr
    assert (elsewhere / "a.py").read_text() == ORIGINAL


def test_root_link_in_a_root_directory_is_followed(tmp_path, tree):
    """What a real host has (/usr/local/cuda -> cuda-12.8, /opt -> /data/opt): root's links, root's dirs."""
    (tmp_path / "via").symlink_to(tree)
    s = text_set(tmp_path, tmp_path / "via")
    r = run(tmp_path / "state", "apply", s)
    assert r.returncode == 0, r.stderr
    assert (tree / "a.py").read_text() == "a = 0\nx = 2  # patched\ny = 3\n"


@pytest.mark.parametrize("how", ["owned by the other user", "group-writable", "world-writable"])
def test_directory_another_user_can_write_is_read_but_never_written(tmp_path, tree, how):
    if how == "owned by the other user":
        os.chown(tree, NOBODY, NOBODY)
    elif how == "group-writable":
        os.chown(tree, 0, NOBODY)
        tree.chmod(0o775)
    else:
        tree.chmod(0o777)
    s = other_set(tmp_path, tree)
    r = run(tmp_path / "state", "check", s)
    assert r.returncode == 1, r.stderr  # reading is fine: a report, no write
    r = run(tmp_path / "state", "apply", s)
    assert r.returncode == 2 and f"{tree} can be changed by" in r.stderr and "Nothing was written" in r.stderr
    assert "Fix: make it root's" in r.stderr
    assert (tree / "b.py").read_text() == OTHER
    assert not (tmp_path / "state" / "manifests").exists()


@pytest.mark.parametrize("where", ["state", "manifests", "originals", "state parent"])
def test_state_directory_reached_through_a_planted_link_is_refused(tmp_path, tree, canary, where):
    """Where the old layout kept root's state (the service user's home), every one of these was possible."""
    victim = tmp_path / "victim"
    victim.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    state = home / "patches"
    if where == "state":
        planted_link(state, victim)
    elif where == "state parent":
        os.chown(home, NOBODY, NOBODY)
    else:
        state.mkdir()
        planted_link(state / where, victim)
    before = fingerprint(canary)
    r = run(state, "apply", text_set(tmp_path, tree))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "symbolic link" in r.stderr or "can be changed by" in r.stderr
    assert list(victim.iterdir()) == []
    assert (tree / "a.py").read_text() == ORIGINAL
    assert fingerprint(canary) == before


def test_planted_kept_original_and_manifest_links_are_not_followed(tmp_path, tree, canary):
    """Links inside root's state can only come from root, but even then no write goes through them."""
    state = tmp_path / "state"
    kept = state / "originals" / str(tree / "a.py").lstrip("/")
    kept.parent.mkdir(parents=True)
    planted_link(kept, canary, uid=0)
    (state / "manifests").mkdir()
    planted_link(state / "manifests" / "demo.json", canary, uid=0)
    before = fingerprint(canary)
    r = run(state, "apply", text_set(tmp_path, tree))
    assert r.returncode == 2 and "is a symbolic link" in r.stderr, r.stderr
    assert fingerprint(canary) == before
    assert (tree / "a.py").read_text() == ORIGINAL


def test_owner_and_mode_kept_through_descriptors(tmp_path, tree):
    os.chown(tree / "b.py", NOBODY, NOBODY)
    (tree / "b.py").chmod(0o640)
    assert run(tmp_path / "state", "apply", other_set(tmp_path, tree)).returncode == 0
    st = (tree / "b.py").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (NOBODY, NOBODY, 0o640)
    assert (tree / "b.py").read_text() == OTHER.replace("flag = True", "flag = False")
    assert [p.name for p in tree.iterdir() if p.name.startswith(".")] == [], "no temp file left"
    state = tmp_path / "state"
    assert (state.stat().st_mode & 0o022) == 0 and (state / "manifests").stat().st_uid == 0


def manifest(state: Path, name: str) -> dict:
    p = state / "manifests" / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else {"files": {}}


WRITES = 8  # two sets: 2 kept originals, 2 intent manifests, 2 files, 2 done manifests


@pytest.mark.parametrize("kill_after", range(1, WRITES + 1))
def test_killed_between_writes_then_rerun_finishes_then_nothing(tmp_path, tree, kill_after):
    state = tmp_path / "state"
    sets = [text_set(tmp_path, tree), other_set(tmp_path, tree)]
    files = {"demo": tree / "a.py", "other": tree / "b.py"}
    originals = {n: sha(p) for n, p in files.items()}

    r = run(state, "apply", *sets, GLM_FLASH_PATCH_KILL_AFTER=str(kill_after))
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    # every file is either as it was, or patched and recorded (the intent says so)
    for name, path in files.items():
        if sha(path) != originals[name]:
            entry = manifest(state, name)["files"].get(str(path))
            assert entry and entry["patched_sha256"] == sha(path), f"{path} patched without a manifest entry"
        assert [p.name for p in tree.iterdir() if p.name.startswith(".")] == [], "temp file left in the target dir"

    r = run(state, "apply", *sets)
    assert r.returncode == 0, r.stderr
    for name, path in files.items():
        entry = manifest(state, name)["files"][str(path)]
        assert entry["state"] == "done" and entry["patched_sha256"] == sha(path) != originals[name]
        assert sha(entry["original_copy"]) == entry["original_sha256"] == originals[name]
    after = {n: (sha(p), p.stat().st_mtime_ns) for n, p in files.items()}
    manifests = {n: (state / "manifests" / f"{n}.json").read_bytes() for n in files}

    r = run(state, "apply", *sets)
    assert r.returncode == 0 and r.stdout.split()[::2] == ["applied", "applied"], r.stdout
    assert {n: (sha(p), p.stat().st_mtime_ns) for n, p in files.items()} == after
    assert {n: (state / "manifests" / f"{n}.json").read_bytes() for n in files} == manifests
    assert run(state, "check", *sets).returncode == 0


def test_killed_while_moving_to_a_new_edition_then_rerun(tmp_path, tree):
    state = tmp_path / "state"
    assert run(state, "apply", text_set(tmp_path, tree, replace="x = [1, 2]\n")).returncode == 0
    new = text_set(tmp_path, tree, replace="x = [1, 2, 4]\n", fname="set2.json")
    # writes: the kept original is there already, so 1 = intent manifest, 2 = the file
    r = run(state, "apply", new, GLM_FLASH_PATCH_KILL_AFTER="1")
    assert r.returncode == -signal.SIGKILL
    assert (tree / "a.py").read_text() == "a = 0\nx = [1, 2]\ny = 3\n"
    assert run(state, "apply", new).returncode == 0
    assert (tree / "a.py").read_text() == "a = 0\nx = [1, 2, 4]\ny = 3\n"
    assert run(state, "check", new).returncode == 0


def test_state_from_the_old_place_is_rederived_never_read(tmp_path, tree, canary):
    """Migration: a host patched by the old tool, its state in the service user's home (here `old`,
    tampered with: a manifest and an 'original' of the attacker's choosing). The new state is built
    from the patched files alone; the old directory is never opened."""
    old, new_state = tmp_path / "old", tmp_path / "new"
    sets = [text_set(tmp_path, tree), other_set(tmp_path, tree)]
    assert run(old, "apply", *sets).returncode == 0
    patched = {p: (sha(p), p.stat().st_mtime_ns) for p in (tree / "a.py", tree / "b.py")}
    evil = old / "originals" / str(tree / "a.py").lstrip("/")
    evil.write_text("import os; os.system('id')\nx = 1\n")
    m = manifest(old, "demo")
    m["files"][str(tree / "a.py")]["original_sha256"] = sha(evil)
    (old / "manifests" / "demo.json").write_text(json.dumps(m))
    os.chown(old, NOBODY, NOBODY)  # what the service user could do to it

    r = run(new_state, "check", *sets)
    assert r.returncode == 1 and "not recorded yet" in r.stdout, r.stdout
    r = run(new_state, "apply", *sets)
    done = [line.split()[0] for line in r.stdout.splitlines() if not line.startswith("pending")]
    assert r.returncode == 0 and done == ["recorded", "recorded"], r.stdout
    assert {p: (sha(p), p.stat().st_mtime_ns) for p in patched} == patched, "adopting writes no target"
    kept = new_state / "originals" / str(tree / "a.py").lstrip("/")
    assert kept.read_text() == ORIGINAL
    assert (new_state / "originals" / str(tree / "b.py").lstrip("/")).read_text() == OTHER
    assert manifest(new_state, "demo")["files"][str(tree / "a.py")]["original_sha256"] == sha(kept)
    r = run(new_state, "apply", *sets)
    assert r.returncode == 0 and r.stdout.split()[::2] == ["applied", "applied"], r.stdout
    # and the adopted original serves the next edition
    r = run(new_state, "apply", text_set(tmp_path, tree, replace="x = 7\n", fname="set2.json"))
    assert r.returncode == 0 and (tree / "a.py").read_text() == "a = 0\nx = 7\ny = 3\n"


def test_an_earlier_editions_original_in_the_old_state_is_never_read(tmp_path, tree):
    """An engine file patched by an older edition of a set, on a host from before: its kept original
    sits in the old, service-writable state. It is not read even when the wheel's RECORD vouches for
    it (the service user can point that directory anywhere, at a huge file too): the file is left as
    it is and reported, until the package is reinstalled."""
    info = tree / "demo-1.0.dist-info"
    info.mkdir()
    digest = base64.urlsafe_b64encode(hashlib.sha256(ORIGINAL.encode()).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"a.py,sha256={digest},{len(ORIGINAL)}\ndemo-1.0.dist-info/RECORD,,\n")
    old, new_state = tmp_path / "old", tmp_path / "new"
    assert run(old, "apply", text_set(tmp_path, tree, replace="x = [1, 2]\n")).returncode == 0
    os.chown(old, NOBODY, NOBODY)
    edition2 = text_set(tmp_path, tree, replace="x = [1, 2, 4]\n", fname="set2.json")
    r = run(new_state, "apply", edition2, GLM_FLASH_OLD_STATE_DIR=str(old))
    assert r.returncode == 2 and "anchor found 0 times" in r.stderr, r.stderr
    assert (tree / "a.py").read_text() == "a = 0\nx = [1, 2]\ny = 3\n"


def test_a_sparse_huge_target_is_refused_unread(tmp_path, tree):
    with open(tree / "a.py", "r+b") as f:
        f.truncate(1 << 40)  # 1 TiB of holes: read whole, it exhausts root's memory
    r = run(tmp_path / "state", "check", text_set(tmp_path, tree))
    assert r.returncode != 0 and "bytes" in r.stdout + r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("plant", ["log is a link", "log dir is a link", "log dir is the other user's"])
def test_dpkg_hook_log_never_written_through_a_link(tmp_path, canary, plant):
    """The dpkg hook appends to its log as root: never through a link, never in another user's dir;
    apt still succeeds and the problem is shown."""
    _, header, env, _ = fact_output(tmp_path, "2.41")
    logdir = tmp_path / "log"
    if plant == "log is a link":
        logdir.mkdir()
        planted_link(logdir / "cuda-header.log", canary, uid=0)
    elif plant == "log dir is a link":
        victim = tmp_path / "victim"
        victim.mkdir()
        planted_link(logdir, victim, uid=0)
    else:
        logdir.mkdir()
        os.chown(logdir, NOBODY, NOBODY)
    before = fingerprint(canary)
    r = run_hook(tmp_path / "usr-local", dict(env, GLM_FLASH_HOOK_LOG=str(logdir / "cuda-header.log")))
    assert r.returncode == 0 and f"fixed     {header}" in r.stderr, r.stderr
    assert f"cannot write {logdir / 'cuda-header.log'}" in r.stderr, r.stderr
    assert fingerprint(canary) == before
    assert not (tmp_path / "victim").exists() or list((tmp_path / "victim").iterdir()) == []
