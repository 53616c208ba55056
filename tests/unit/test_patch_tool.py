"""files/glm-flash-patch: text, json and require edits, several sets per run, earlier editions.

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

CONFIG = """{
  "architectures": [
    "Glm5NextForCausalLM"
  ],
  "index_share_for_mtp_iteration": true,
  "num_nextn_predict_layers": 1,
  "text_config": {
    "index_share_for_mtp_iteration": true,
    "index_topk": 2048,
    "rope_theta": 1000000.0
  },
  "torch_dtype": "bfloat16"
}
"""


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


def json_set(tmp_path, root, name="model", **edit_extra):
    edits = [
        {"id": "top", "json_path": ["index_share_for_mtp_iteration"], "expect": True, "value": False},
        {"id": "nested", "json_path": ["text_config", "index_share_for_mtp_iteration"], "expect": True, "value": False},
    ]
    return write_set(
        tmp_path / f"{name}.json",
        name=name,
        package="zai-org/GLM-5.3-Flash",
        version="rev1",
        root=str(root),
        files=[{"path": "config.json", "edits": edits}],
    )


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.py").write_text("a = 0\nx = 1\ny = 3\n")
    (root / "config.json").write_text(CONFIG)
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


def test_json_edit_changes_only_the_values(tmp_path, tree, env):
    s = json_set(tmp_path, tree)
    assert run(env, "check", s).returncode == 1
    r = run(env, "apply", s)
    assert r.returncode == 0, r.stderr
    new = (tree / "config.json").read_text()
    assert new == CONFIG.replace('"index_share_for_mtp_iteration": true', '"index_share_for_mtp_iteration": false')
    data = json.loads(new)
    assert data["index_share_for_mtp_iteration"] is False
    assert data["text_config"]["index_share_for_mtp_iteration"] is False
    before = sha(tree / "config.json")
    r2 = run(env, "apply", s)
    assert r2.returncode == 0 and sha(tree / "config.json") == before
    assert run(env, "check", s).returncode == 0
    # the kept original is the unpatched file, byte for byte
    orig = tmp_path / "state/originals" / str(tree / "config.json").lstrip("/")
    assert orig.read_text() == CONFIG


@pytest.mark.parametrize(
    "config,needle",
    [
        (CONFIG.replace('"index_share_for_mtp_iteration": true,\n  "num', '"num'), "missing"),
        (CONFIG.replace('"index_topk": 2048', '"index_topk": 2048, "index_share_for_mtp_iteration": true'), "2 times"),
        (
            CONFIG.replace(
                '"index_share_for_mtp_iteration": true,\n  "num', '"index_share_for_mtp_iteration": 1,\n  "num'
            ),
            "is 1, expected true",
        ),
        (CONFIG[:-3], "not valid JSON"),
        (
            CONFIG.replace('"text_config": {', '"text_config": [').replace('"rope_theta": 1000000.0\n  }', '"r": 1]'),
            "not valid JSON",
        ),
    ],
)
def test_json_drift_is_refused(tmp_path, tree, env, config, needle):
    (tree / "config.json").write_text(config)
    s = json_set(tmp_path, tree)
    r = run(env, "apply", s)
    assert r.returncode == 2
    assert needle in r.stderr and "zai-org/GLM-5.3-Flash rev1" in r.stderr and "patch model" in r.stderr
    assert (tree / "config.json").read_text() == config
    assert not (tmp_path / "state").exists()


def test_json_path_into_a_list_and_wrong_container(tmp_path, tree, env):
    (tree / "config.json").write_text('{"layers": [ {"a": true}, {"a": true} ]}')
    ok = write_set(
        tmp_path / "l.json",
        name="l",
        root=str(tree),
        files=[
            {
                "path": "config.json",
                "edits": [{"id": "second", "json_path": ["layers", 1, "a"], "expect": True, "value": False}],
            }
        ],
    )
    assert run(env, "apply", ok).returncode == 0
    assert (tree / "config.json").read_text() == '{"layers": [ {"a": true}, {"a": false} ]}'
    bad = write_set(
        tmp_path / "b.json",
        name="b",
        root=str(tree),
        files=[
            {
                "path": "config.json",
                "edits": [{"id": "w", "json_path": ["layers", "a"], "expect": True, "value": False}],
            }
        ],
    )
    r = run(env, "check", bad)
    assert r.returncode == 2 and "not an object/list" in r.stderr


def test_one_drifted_set_refuses_every_set_of_the_run(tmp_path, tree, env):
    a = text_set(tmp_path, tree)
    (tree / "config.json").write_text(CONFIG.replace("true", "false", 1))  # top level already changed by hand
    b = json_set(tmp_path, tree)
    before = {p: sha(p) for p in (tree / "a.py", tree / "config.json")}
    r = run(env, "apply", a, b, extra=["--json"])
    assert r.returncode == 2
    states = json.loads(r.stdout.strip().splitlines()[-1])
    assert states[str(tree / "a.py")]["state"] == "pending"
    assert states[str(tree / "config.json")]["state"] == "drift"
    assert states[str(tree / "config.json")]["package"] == "zai-org/GLM-5.3-Flash"
    assert "only partly patched" in r.stderr
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
        {
            "name": "b",
            "files": [{"path": "config.json", "edits": [{"id": "e", "json_path": ["a"], "expect": 1, "value": 1}]}],
        },
        {"files": []},
    ]
    for i, pset in enumerate(bad):
        s = write_set(tmp_path / f"bad{i}.json", root=str(tree), **pset)
        r = run(env, "apply", s)
        assert r.returncode == 2 and "bad patch set" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert (tree / "a.py").read_text() == "a = 0\nx = 1\ny = 3\n"
    r = run(env, "check", text_set(tmp_path, tree), json_set(tmp_path, tree), extra=["--file", str(tree / "a.py")])
    assert r.returncode == 2 and "one patch set" in r.stderr


def test_mode_and_owner_are_kept(tmp_path, tree, env):
    os.chmod(tree / "config.json", 0o600)
    os.chown(tree / "config.json", 1234, 1234)
    assert run(env, "apply", json_set(tmp_path, tree)).returncode == 0
    st = os.stat(tree / "config.json")
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o600, 1234, 1234)


def model_set(tmp_path, root):
    """The repo's own config.json set (patches/model/), rendered as roles/engines/kt/patches.py does."""
    import yaml

    from control import patch_sets

    raw = yaml.safe_load((REPO / "patches/model/glm-5.3-flash-index-share.yaml").read_text())
    return write_set(tmp_path / "model-set.json", **patch_sets.render(raw, {}, str(root), version="rev1"))


# The public record shows the nested key only: a config.json without the top-level one.
NESTED_ONLY = CONFIG.replace('\n  "index_share_for_mtp_iteration": true,', "", 1)


def test_config_without_the_top_level_key_patches_cleanly(tmp_path, tree, env):
    assert "index_share_for_mtp_iteration" not in json.loads(NESTED_ONLY)
    (tree / "config.json").write_text(NESTED_ONLY)
    s = model_set(tmp_path, tree)
    assert run(env, "check", s).returncode == 1
    r = run(env, "apply", s)
    assert r.returncode == 0, r.stderr
    new = (tree / "config.json").read_text()
    assert new == NESTED_ONLY.replace('"index_share_for_mtp_iteration": true', '"index_share_for_mtp_iteration": false')
    assert "index_share_for_mtp_iteration" not in json.loads(new)  # nothing added at the top level
    before = sha(tree / "config.json")
    assert run(env, "apply", s).returncode == 0 and sha(tree / "config.json") == before
    assert run(env, "check", s).returncode == 0
    # with the key the same set edits both, as before
    (tree / "config.json").write_text(CONFIG)
    assert run(env, "apply", s).returncode == 0
    data = json.loads((tree / "config.json").read_text())
    assert (
        data["index_share_for_mtp_iteration"] is False and data["text_config"]["index_share_for_mtp_iteration"] is False
    )


@pytest.mark.parametrize(
    "config,needle",
    [
        # the nested key is the one the engine reads: its absence is still drift
        (CONFIG.replace('    "index_share_for_mtp_iteration": true,\n', ""), "is missing in text_config"),
        # a top-level key that is there but not true is drift, if_present or not
        (
            CONFIG.replace(
                '"index_share_for_mtp_iteration": true,\n  "num', '"index_share_for_mtp_iteration": 1,\n  "num'
            ),
            "is 1",
        ),
        # no text_config at all: the object the edit lives in is missing
        ('{"index_share_for_mtp_iteration": true}', "'text_config' is missing"),
    ],
)
def test_model_set_still_refuses_drift(tmp_path, tree, env, config, needle):
    (tree / "config.json").write_text(config)
    r = run(env, "apply", model_set(tmp_path, tree))
    assert r.returncode == 2 and needle in r.stderr, r.stderr
    assert (tree / "config.json").read_text() == config


def test_if_present_only_on_json_edits(tmp_path, tree, env):
    bad = write_set(
        tmp_path / "bad.json",
        name="bad",
        root=str(tree),
        files=[{"path": "a.py", "edits": [{"id": "x", "anchor": "x = 1\n", "replace": "x = 2\n", "if_present": True}]}],
    )
    r = run(env, "apply", bad)
    assert r.returncode == 2 and "if_present is a json edit's option" in r.stderr, r.stderr
