"""files/glm-flash-patch: text and require edits, several sets per run, earlier editions.

Runs the real tool as a subprocess on files in a temp dir (stdlib python, as on a host).
The CUDA header suite (test_cuda_header_fix.py) covers the tool on a real header too.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "files" / "glm-flash-patch"


def sha(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


@pytest.fixture
def env(tmp_path):
    return dict(os.environ, GLM_FLASH_STATE_DIR=str(tmp_path / "state"))


def run(env, action, *sets, extra=()):
    return subprocess.run(
        [sys.executable, str(TOOL), action, *map(str, sets), *extra], env=env, capture_output=True, text=True
    )


def write_set(path, **pset):
    path.write_text(json.dumps(pset))
    return path


def text_set(tmp_path, root, name="demo", replace="x = 2  # patched\n", fname="set.json"):
    return write_set(
        tmp_path / fname,
        name=name,
        package="demo-pkg",
        version="1.0",
        root=str(root),
        files=[{"path": "a.py", "edits": [{"id": "x", "anchor": "x = 1\n", "replace": replace}]}],
    )


def other_set(tmp_path, root, name="other"):
    """A second set of the run, on another file of another package."""
    return write_set(
        tmp_path / f"{name}.json",
        name=name,
        package="other-pkg",
        version="2.0",
        root=str(root),
        files=[{"path": "b.py", "edits": [{"id": "flag", "anchor": "flag = True\n", "replace": "flag = False\n"}]}],
    )


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.py").write_text("a = 0\nx = 1\ny = 3\n")
    (root / "b.py").write_text("import os\nflag = True\n")
    return root


def test_text_edit_apply_then_noop(tmp_path, tree, env):
    s = text_set(tmp_path, tree)
    assert run(env, "check", s).returncode == 1
    r = run(env, "apply", s)
    assert r.returncode == 0, r.stderr
    assert (tree / "a.py").read_text() == "a = 0\nx = 2  # patched\ny = 3\n"
    st = os.stat(tree / "a.py")
    r2 = run(env, "apply", s)
    assert r2.returncode == 0 and "patched" not in r2.stdout.replace("applied", "")
    assert os.stat(tree / "a.py").st_mtime_ns == st.st_mtime_ns
    assert run(env, "check", s).returncode == 0
    m = json.loads((tmp_path / "state/manifests/demo.json").read_text())
    entry = m["files"][str(tree / "a.py")]
    assert m["package"] == "demo-pkg" and m["version"] == "1.0"
    assert entry["patched_sha256"] == sha(tree / "a.py")
    assert Path(entry["original_copy"]).read_text() == "a = 0\nx = 1\ny = 3\n"


def test_one_drifted_set_refuses_every_set_of_the_run(tmp_path, tree, env):
    a = text_set(tmp_path, tree)
    (tree / "b.py").write_text("import os\nflag = 1\n")  # upstream changed the line the other set edits
    b = other_set(tmp_path, tree)
    before = {p: sha(p) for p in (tree / "a.py", tree / "b.py")}
    r = run(env, "apply", a, b, extra=["--json"])
    assert r.returncode == 2
    states = json.loads(r.stdout.strip().splitlines()[-1])
    assert states[str(tree / "a.py")]["state"] == "pending"
    assert states[str(tree / "b.py")]["state"] == "drift"
    assert states[str(tree / "b.py")]["package"] == "other-pkg"
    assert "other-pkg 2.0" in r.stderr and "anchor found 0 times" in r.stderr
    assert {p: sha(p) for p in before} == before
    assert not (tmp_path / "state").exists()


def test_require_edit_checks_without_writing(tmp_path, tree, env):
    (tree / "METADATA").write_text("Name: demo\nVersion: 1.0\n")

    def s(version):
        return write_set(
            tmp_path / f"r{version}.json",
            name="r",
            package="demo",
            version=version,
            root=str(tree),
            files=[
                {"path": "METADATA", "edits": [{"id": "installed", "require": f"Version: {version}\n"}]},
                {"path": "a.py", "edits": [{"id": "x", "anchor": "x = 1\n", "replace": "x = 5\n"}]},
            ],
        )

    r = run(env, "apply", s("2.0"))
    assert r.returncode == 2 and "Version: 2.0" in r.stderr and "demo 2.0" in r.stderr
    assert (tree / "a.py").read_text() == "a = 0\nx = 1\ny = 3\n"
    assert run(env, "apply", s("1.0")).returncode == 0
    assert (tree / "a.py").read_text() == "a = 0\nx = 5\ny = 3\n"
    assert (tree / "METADATA").read_text() == "Name: demo\nVersion: 1.0\n"
    m = json.loads((tmp_path / "state/manifests/r.json").read_text())
    assert list(m["files"]) == [str(tree / "a.py")]
    assert run(env, "check", s("1.0")).returncode == 0


def test_earlier_edition_is_repatched_from_the_original(tmp_path, tree, env):
    assert run(env, "apply", text_set(tmp_path, tree, replace="x = [1, 2]  # patched\n")).returncode == 0
    new = text_set(tmp_path, tree, replace="x = [1, 2, 4]  # patched\n", fname="set2.json")
    r = run(env, "check", new)
    assert r.returncode == 1 and "earlier edition" in r.stdout
    assert run(env, "apply", new).returncode == 0
    assert (tree / "a.py").read_text() == "a = 0\nx = [1, 2, 4]  # patched\ny = 3\n"
    assert run(env, "check", new).returncode == 0
    # a file changed by someone else is not ours to re-patch
    (tree / "a.py").write_text("a = 0\nx = [1, 2, 4, 8]  # patched\ny = 3\n")
    r = run(env, "apply", text_set(tmp_path, tree, replace="x = 9\n", fname="set3.json"))
    assert r.returncode == 2 and "anchor found 0 times" in r.stderr
    assert (tree / "a.py").read_text() == "a = 0\nx = [1, 2, 4, 8]  # patched\ny = 3\n"


def test_bad_sets_are_refused_with_a_message(tmp_path, tree, env):
    bad = [
        {"name": "b", "files": [{"path": "a.py", "edits": [{"id": "e", "anchor": "x"}]}]},
        {
            "name": "b",
            "files": [{"path": "a.py", "edits": [{"id": "e", "anchor": "x", "replace": "y", "require": "z"}]}],
        },
        # JSON value edits went with the checkpoint edit (an engine edit now): refused as unknown
        {
            "name": "b",
            "files": [{"path": "config.json", "edits": [{"id": "e", "json_path": ["a"], "expect": 1, "value": 2}]}],
        },
        {"files": []},
    ]
    for i, pset in enumerate(bad):
        s = write_set(tmp_path / f"bad{i}.json", root=str(tree), **pset)
        r = run(env, "apply", s)
        assert r.returncode == 2 and "bad patch set" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tree / "a.py").read_text() == "a = 0\nx = 1\ny = 3\n"
    r = run(env, "check", text_set(tmp_path, tree), other_set(tmp_path, tree), extra=["--file", str(tree / "a.py")])
    assert r.returncode == 2 and "one patch set" in r.stderr


def test_mode_and_owner_are_kept(tmp_path, tree, env):
    os.chmod(tree / "b.py", 0o600)
    os.chown(tree / "b.py", 1234, 1234)
    assert run(env, "apply", other_set(tmp_path, tree)).returncode == 0
    assert (tree / "b.py").read_text() == "import os\nflag = False\n"
    st = os.stat(tree / "b.py")
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o600, 1234, 1234)
