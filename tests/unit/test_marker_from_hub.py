"""A fleet's receivers check their copies against the hub's list, never a worker's word alone (#36 H2).

The seed's marker (what its download verified) used to reach every receiver verbatim: a worker that
altered a file and its marker poisoned every checkpoint it sent. Now the control machine asks the
hub for its own file list at the locked commit (control/model_lock.py hub_files) and holds the
seed's marker against it (checked_by_hub): a large (LFS) file's size and sha256, every file's git
blob id. A small file's sha256 can only be the seed's (the hub names it by its blob id), so the
receive (files/glm-flash-model-fetch receive) checks a received small file's blob id, the hub's.

The hub here is sandbox/fake_hub.py (the hub's model-info API with blobs, on loopback); the
transfer is the real glm-flash-peer server and aria2c (Debian's aria2, which `make deps` installs).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from control import model_lock
from sandbox.fake_hub import FakeHub
from tests.conftest import REPO

REPO_ID = "zai-org/GLM-5.3-Flash"
COMMIT = "c0ffee" + "0" * 34
SHARD = "model-00001-of-00001.safetensors"
FETCH, PEER = REPO / "files" / "glm-flash-model-fetch", REPO / "files" / "glm-flash-peer"
TOKEN = "t" * 40


def checkpoint() -> dict[str, bytes]:
    index = {"metadata": {"total_size": 4096}, "weight_map": {"w0": SHARD}}
    return {
        "config.json": b'{"architectures": ["GlmMoeDsaForCausalLM"]}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        SHARD: bytes(range(256)) * 16,
    }


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def seed_marker(files: dict[str, bytes]) -> dict:
    """A marker as the seed's download writes it (format 2: lfs, size, sha256, blob id per file)."""
    entries = {
        name: {
            "lfs": name.endswith(".safetensors"),
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "blob_id": blob_id(data),
        }
        for name, data in files.items()
    }
    return {"format": 2, "repo": REPO_ID, "revision": COMMIT, "commit": COMMIT, "files": entries}


@pytest.fixture(scope="module")
def hub_list():
    with FakeHub(REPO_ID, checkpoint(), commit=COMMIT) as hub:
        return model_lock.hub_files(hub.endpoint, REPO_ID, COMMIT, None)


def test_the_hub_list_names_every_file_with_its_blob_id_and_the_large_ones_sha256(hub_list):
    files = checkpoint()
    assert hub_list == {
        name: {
            "size": len(data),
            "blob_id": blob_id(data),
            "sha256": hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else None,
        }
        for name, data in files.items()
    }


def test_an_honest_seeds_marker_passes_with_the_hubs_values(hub_list):
    out = json.loads(model_lock.checked_by_hub(json.dumps(seed_marker(checkpoint())), hub_list, REPO_ID, COMMIT))
    assert out["files"] == seed_marker(checkpoint())["files"]
    assert out["repo"] == REPO_ID and out["commit"] == COMMIT


def poisoned(change) -> str:
    marker = seed_marker(checkpoint())
    change(marker["files"])
    return json.dumps(marker)


@pytest.mark.parametrize(
    "change, named, said",
    [
        # a shard altered on the seed and its marker rewritten to match: the hub's sha256 differs
        (lambda f: f[SHARD].update(sha256=hashlib.sha256(b"evil").hexdigest()), SHARD, "sha256 is not the hub's"),
        # a small file altered, its blob id rewritten too
        (lambda f: f["config.json"].update(blob_id=blob_id(b"{}")), "config.json", "blob id is not the hub's"),
        (lambda f: f["config.json"].update(size=3), "config.json", "size or blob id is not the hub's"),
        # a large file passed off as a small one, to escape the sha256 check
        (lambda f: f[SHARD].update(lfs=False), SHARD, "sha256 is not the hub's"),
        (lambda f: f.pop(SHARD), SHARD, "the seed's marker does not"),
        (lambda f: f.update({"extra.py": dict(f["config.json"])}), "extra.py", "the hub does not have"),
    ],
)
def test_a_poisoned_seeds_marker_is_refused_naming_the_file(hub_list, change, named, said):
    with pytest.raises(model_lock.ModelLockError) as e:
        model_lock.checked_by_hub(poisoned(change), hub_list, REPO_ID, COMMIT)
    assert str(e.value).startswith(f"{named}: ") and said in str(e.value), e.value


def test_a_marker_of_another_commit_is_refused(hub_list):
    other = dict(seed_marker(checkpoint()), commit="f" * 40)
    with pytest.raises(model_lock.ModelLockError, match="is not zai-org/GLM-5.3-Flash@c0ffee"):
        model_lock.checked_by_hub(json.dumps(other), hub_list, REPO_ID, COMMIT)


def receive(tmp_path, served: dict[str, bytes], relayed: str) -> tuple[subprocess.CompletedProcess, object]:
    """glm-flash-model-fetch receive into a fresh directory from a glm-flash-peer server of `served`
    (the seed's files as the seed holds them), checked against the `relayed` marker."""
    seed = tmp_path / "seed"
    lines = []
    for name, data in served.items():
        (seed / name).parent.mkdir(parents=True, exist_ok=True)
        (seed / name).write_bytes(data)
        lines.append(f"{hashlib.sha256(data).hexdigest()} {len(data)} 644 {name}\n")
    (tmp_path / "manifest.txt").write_text("".join(lines))
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "peer-token").write_text(TOKEN + "\n")
    (creds / "peer-token").chmod(0o600)
    (tmp_path / "marker.json").write_text(relayed)
    server = subprocess.Popen(
        [sys.executable, str(PEER), "serve", str(seed), str(tmp_path / "manifest.txt"), "--bind", "127.0.0.1"]
        + ["--port", "0", "--token-file", str(creds / "peer-token")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = "http://127.0.0.1:" + server.stdout.readline().rsplit(":", 1)[1].strip()
        dest = tmp_path / "dest"
        r = subprocess.run(
            [sys.executable, str(FETCH), "receive", "--dest", str(dest), "--repo", REPO_ID, "--revision", COMMIT]
            + ["--marker", str(tmp_path / "marker.json"), "--source", url, "--peer-tool", str(PEER)],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, CREDENTIALS_DIRECTORY=str(creds)),
        )
    finally:
        server.terminate()
        server.wait(10)
    return r, dest


def test_the_receive_takes_an_honest_seeds_files(hub_list, tmp_path):
    relayed = model_lock.checked_by_hub(json.dumps(seed_marker(checkpoint())), hub_list, REPO_ID, COMMIT)
    r, dest = receive(tmp_path, checkpoint(), relayed)
    assert r.returncode == 0, r.stdout + r.stderr
    assert {name: (dest / name).read_bytes() for name in checkpoint()} == checkpoint()
    assert json.loads((dest / ".glm-flash-model.json").read_text())["commit"] == COMMIT


def test_the_receive_refuses_a_small_file_the_seed_altered_with_its_sha256(hub_list, tmp_path):
    """What the control machine cannot see: a small file's sha256 is the seed's word. The seed alters
    config.json and claims its new sha256 (size and blob id kept the hub's, so the marker passes the
    control machine's check); the receiver's blob id check refuses it and nothing is vouched for."""
    files = checkpoint()
    evil = files["config.json"].replace(b"GlmMoeDsa", b"EvilModel")
    assert len(evil) == len(files["config.json"])
    marker = seed_marker(files)
    marker["files"]["config.json"]["sha256"] = hashlib.sha256(evil).hexdigest()
    relayed = model_lock.checked_by_hub(json.dumps(marker), hub_list, REPO_ID, COMMIT)
    r, dest = receive(tmp_path, {**files, "config.json": evil}, relayed)
    assert r.returncode == 4, r.stdout + r.stderr
    assert "config.json from the fleet's seed is refused and removed: its git blob id is not" in r.stdout + r.stderr
    assert not (dest / "config.json").exists()
    assert not (dest / ".glm-flash-model.json").exists()
