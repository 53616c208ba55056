"""Engine patches, tuned Triton configs and the model on a deployed node.

Checks what roles/engines/kt/patches.py, roles/engines/kt/triton_configs.py and roles/model.py leave:
the current engine environment's patch sets are fully applied (the host's own
glm-flash-patch check says so), the manifests name the installed version and their hashes
match the files on disk, the installed engine accepts the checkpoint's config.json as the hub
sent it, and each tuned Triton config sits where the engine reads it. Works on the
sandbox and on real hosts; parts that depend on what the profile enables are reported
not applicable otherwise.
"""

from __future__ import annotations

import json
import shlex

import pytest

from control import layout
from control.engine_lock import load_lock, pin_of
from roles import model
from roles.engines.kt import patches as engine_patches
from roles.engines.kt import triton_configs
from roles.operations.checkpoint import token_file

STATE = engine_patches.STATE_DIR


@pytest.fixture(autouse=True)
def _l40s(profile):
    if profile.platform != "l40s":
        pytest.skip("not applicable: the engine patches are for the L40S engine (sglang-kt)")


@pytest.fixture
def env_dir(host, profile):
    current = f"{profile.install_root}/engine/current"
    r = host.run(f"readlink -f {shlex.quote(current)}")
    if r.rc != 0 or not host.file(r.stdout.strip()).is_directory:
        pytest.fail(f"{current} does not point at an engine environment")
    return r.stdout.strip()


@pytest.fixture
def sets(host, env_dir):
    d = engine_patches.set_dir(env_dir)
    out = host.run(f"ls {shlex.quote(d)}/*.json")
    assert out.rc == 0, f"no patch sets uploaded into {d}"
    return out.stdout.split()


def locked(profile, name: str) -> str:
    """The version the profile's engine lock pins (what the deploy installed)."""
    return pin_of(load_lock(profile.engine_set)[1], name).version


def sha256(host, path):
    r = host.run(f"sha256sum {shlex.quote(path)}")
    assert r.rc == 0, r.stderr
    return r.stdout.split()[0]


def test_patch_sets_match_the_installed_version(host, profile, env_dir, sets):
    version = locked(profile, "sglang-kt")
    names = {s.rsplit("/", 1)[-1] for s in sets}
    assert f"sglang-kt-{version}.json" in names
    site = layout.site_packages(profile, env_dir)
    meta = host.file(f"{site}/sglang_kt-{version}.dist-info/METADATA")
    assert meta.exists and f"Version: {version}\n" in meta.content_string


def test_every_set_is_applied_per_the_host_tool(host, profile, sets):
    tool = f"{profile.install_root}/bin/glm-flash-patch"
    r = host.run(f"{shlex.quote(tool)} check --json " + " ".join(map(shlex.quote, sets)))
    assert r.rc == 0, r.stdout + r.stderr
    states = json.loads(r.stdout.strip().splitlines()[-1])
    assert states and all(v["state"] in ("applied", "upstream") for v in states.values()), states


def test_manifests_hold_version_and_hashes_of_the_files_on_disk(host, profile, env_dir, sets):
    checked = 0
    for s in sets:
        pset = json.loads(host.file(s).content_string)
        manifest = host.file(f"{STATE}/manifests/{pset['name']}.json")
        assert manifest.exists, f"no manifest for {pset['name']}"
        m = json.loads(manifest.content_string)
        assert (m["package"], m["version"]) == (pset["package"], pset["version"])
        for spec in pset["files"]:
            if not any("anchor" in e for e in spec["edits"]):
                continue
            path = f"{pset['root']}/{spec['path']}"
            entry = m["files"].get(path)
            assert entry, f"{path} is not in the manifest of {pset['name']}"
            assert sha256(host, path) == entry["patched_sha256"], f"{path} changed since it was patched"
            assert host.file(entry["original_copy"]).exists
            assert sha256(host, entry["original_copy"]) == entry["original_sha256"]
            checked += 1
    assert checked >= 2


def test_engine_edits_are_the_intended_ones(host, profile, env_dir):
    site = layout.site_packages(profile, env_dir)
    kpool = host.file(f"{site}/sglang/srt/layers/attention/nsa/nsa_indexer_kpool.py").content_string
    assert "if max_kv_len <= self.index_topk and not self._should_use_triton_logits(x):" in kpool
    args = host.file(f"{site}/sglang/srt/server_args.py").content_string
    assert f"self.cuda_graph_bs = {list(profile.cuda_graph_bs)!r}  # glm-flash" in args
    assert f"self.cuda_graph_max_bs = {max(profile.cuda_graph_bs)}\n" in args
    r = host.run(
        f"{shlex.quote(env_dir)}/bin/python -m py_compile "
        f"{shlex.quote(site)}/sglang/srt/server_args.py {shlex.quote(site)}/sglang/srt/layers/attention/nsa/nsa_indexer_kpool.py"
    )
    assert r.rc == 0, r.stderr


# sglang-kt's GLM attention as the checkpoint needs it: its config.json says
# index_share_for_mtp_iteration: true (docs/sources.md §4). post1 and post2 as released refuse that
# with the line below; post3 and later accept it and turn it off for the DeepSeek base class with the
# other. Written here, not read from the patch sets under test: an engine left as released fails.
MODEL_PY = "sglang/srt/models/glm5_next_dsa.py"
REFUSES = 'raise ValueError("GLM-5-Next KPool does not support index sharing for MTP")'
TURNS_OFF = "base_config.index_share_for_mtp_iteration = False"


def test_the_engine_accepts_the_checkpoints_config_as_the_hub_sent_it(host, profile, env_dir):
    src = host.file(f"{layout.site_packages(profile, env_dir)}/{MODEL_PY}")
    assert src.exists, f"{MODEL_PY} is not in the engine environment"
    text = src.content_string
    assert REFUSES not in text, f"the engine refuses the checkpoint's index sharing for MTP ({MODEL_PY})"
    assert TURNS_OFF in text, f"{MODEL_PY} does not turn index sharing for MTP off for the base class"
    cfg = host.file(f"{profile.model_path}/config.json")
    assert cfg.exists, f"{profile.model_path}/config.json is missing"
    if profile.model_download:  # the marker holds the hub's sha256 of it: never edited after the download
        marker = json.loads(host.file(f"{profile.model_path}/.glm-flash-model.json").content_string)
        assert sha256(host, cfg.path) == marker["files"]["config.json"]["sha256"], "config.json is not the hub's"


def test_model_present_and_no_token_left(host, profile):
    tool = f"{profile.install_root}/bin/{model.FETCH}"
    extra = (
        f" --repo {shlex.quote(profile.model_id)} --revision {shlex.quote(profile.model_revision)}"
        if profile.model_download
        else ""
    )
    r = host.run(f"python3 {shlex.quote(tool)} check --dest {shlex.quote(profile.model_path)}{extra}")
    assert r.rc == 0, r.stdout + r.stderr
    assert not host.file(token_file(model.MODEL_UNIT)).exists


def test_service_environment_is_offline(host):
    env = host.file("/etc/glm-flash/glm-flash.env")
    assert env.exists and "HF_HUB_OFFLINE=1" in env.content_string.splitlines()


def test_tuned_triton_configs_where_the_engine_reads_them(host, profile, env_dir):
    places = triton_configs.placements(profile, layout.site_packages(profile, env_dir), locked(profile, "triton"))
    if not places:
        pytest.skip("not applicable: triton_configs_dir is empty in the profile")
    for p in places:
        f = host.file(p.dest)
        assert f.exists, p.dest
        assert sha256(host, p.dest) == __import__("hashlib").sha256(p.src.read_bytes()).hexdigest()
    if any(p.kind == "moe" for p in places):
        env = host.file("/etc/glm-flash/glm-flash.env").content_string
        assert f"SGLANG_MOE_CONFIG_DIR={triton_configs.moe_dir(profile)}" in env.splitlines()
