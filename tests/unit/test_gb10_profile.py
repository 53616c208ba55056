"""GB10 profile rules: the drafter licence must be accepted, the fork pinned to a commit;
the example inventory resolves to the field report's settings."""

import runpy
from pathlib import Path

import pytest

from control.profile import ProfileError, build
from roles.facts.gb10 import Gb10View, MemTotalKiB, OsRelease
from roles.facts.system import Gpus
from tests.unit.first_contact import filled, load, user_home

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
REF = "0123456789abcdef0123456789abcdef01234567"


def problems(data):
    with pytest.raises(ProfileError) as e:
        build("gx10", data, api_key_present=False)
    return {p.key: p for p in e.value.problems}


def test_drafter_licence_must_be_accepted_before_anything_happens():
    p = problems({"platform": "gb10", "vllm_ref": REF})
    assert list(p) == ["accept_drafter_license"]
    assert "CC-BY-NC-ND-4.0" in p["accept_drafter_license"].problem
    assert "accept_drafter_license: true" in p["accept_drafter_license"].fix


def test_licence_is_a_gb10_rule_only():
    build("gpu1", {}, api_key_present=False)  # L40S: no drafter, nothing to accept


@pytest.mark.parametrize("ref", ["v0.3.0", "main", "0123abc", REF.upper(), REF + "0"])
def test_the_fork_is_pinned_to_a_full_commit(ref):
    p = problems({"platform": "gb10", "vllm_ref": ref, "accept_drafter_license": True})
    assert list(p) == ["vllm_ref"] and "full commit" in p["vllm_ref"].problem


@pytest.mark.parametrize("ref", ["nv-dev", "v2.1.0", "a6b593d2", "A6B593D2826719DCF4892609AF7B84EE23AAF32A", ""])
def test_deepgemm_is_pinned_to_a_full_commit(ref):
    """A tag, branch or short hash of DeepGEMM is refused in the profile, before any host is touched."""
    p = problems({"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True, "deepgemm_ref": ref})
    assert list(p) == ["deepgemm_ref"] and "full commit" in p["deepgemm_ref"].problem


def test_deepgemm_defaults_to_the_forks_dockerfile_pin():
    p = build("gx10", {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True}, api_key_present=False)
    assert p.deepgemm_ref == "a6b593d2826719dcf4892609af7b84ee23aaf32a"
    assert p.deepgemm_repo_url == "https://github.com/deepseek-ai/DeepGEMM.git"


def test_the_inventory_without_acceptance_stops_pyinfra_cleanly(tmp_path):
    inv = filled("gb10.py", tmp_path, **{'"accept_drafter_license": True': '"accept_drafter_license": False'})
    r = load(inv, user_home(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no host was changed" in r.stderr and "gx10.lan: accept_drafter_license" in r.stderr


def test_example_inventory_resolves_to_the_field_settings(tmp_path, monkeypatch):
    inv = filled("gb10.py", tmp_path)
    monkeypatch.setenv("HOME", str(user_home(tmp_path)))
    monkeypatch.chdir(inv.parents[2])  # the checkout (the inventory is in inventory/local/)
    ((name, data),) = runpy.run_path(str(inv))["hosts"]
    p = build(name, data, api_key_present=False)
    assert (p.platform, p.driver_source, p.tp_size, p.gpu_count, p.gpu_compute_capability) == (
        "gb10",
        "preinstalled",
        1,
        1,
        "12.1",
    )
    assert (p.max_model_len, p.max_num_seqs, p.num_speculative_tokens, p.thinking_token_budget) == (204800, 1, 7, 1536)
    assert (p.reasoning_effort, p.mamba_cache_mode, p.drop_page_cache, p.python_version) == (
        "low",
        "align",
        True,
        "3.12",
    )
    # the fork as the report ran it (docs/sources.md §20): 2-bit planes from the FP8 checkpoint, 2 GiB FP4 pool
    assert (p.vllm_version, p.fork_patches, p.fork_kernels) == (
        "0.24.0",
        ["patch/vllm-moet-v0.24.0.patch"],
        "kernels/cubins-sm120",
    )
    assert (p.moe_w2, p.moe_w2_delta_gb, p.moe_w2_gate, p.moe_w2_store) == (True, 2.0, False, True)
    assert (p.model_id, p.model_download, p.model_path) == ("zai-org/GLM-5.3-Flash", True, "/srv/models/GLM-5.3-Flash")
    assert p.drafter_revision == "bf582e4eacc1810f76656d1811693ff6c6737d2a"


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("fork_patches", ["../../etc/shadow"], "relative path inside the fork"),
        ("fork_patches", ["patch/a.patch", "/patch/x.patch"], "relative path inside the fork"),
        ("fork_patches", "patch/a.patch", "expected a list"),
        ("fork_patches", [], "is empty"),
        ("fork_patches", ["patch/a.patch", "patch/a.patch"], "twice"),
        ("scheduler_fix_verified_ref", "v0.3.0", "full commit"),
        ("scheduler_fix_verified_ref", "1" * 40, "is not vllm_ref"),
        ("fork_kernels", "kernels/$(id)", "relative path inside the fork"),
        ("vllm_version", "0.33.0", "0.24.0"),
        ("moe_w2_delta_gb", 100, "64"),
    ],
)
def test_fork_knobs_are_shaped(key, value, words):
    inv = {"platform": "gb10", "vllm_ref": "a" * 40, "accept_drafter_license": True, key: value}
    with pytest.raises(ProfileError) as e:
        build("gx10.example.lan", inv, api_key_present=False)
    assert key in str(e.value) and words in str(e.value)


def read(name):
    return (DATA / name).read_text().splitlines()


def view(**over):
    base = dict(
        arch=read("gb10-uname-m.txt")[0],
        os=OsRelease.parse(read("gb10-os-release.txt") + [OsRelease.SEP] + read("gb10-dgx-release.txt")),
        gpus=tuple(Gpus.parse(read("gb10-nvidia-smi-query-gpu.csv"))),
        mem_total_kib=MemTotalKiB.parse(read("gb10-meminfo.txt")),
    )
    base.update(over)
    return Gb10View(**base)


def test_recorded_gb10_output_is_recognised():
    v = view()
    assert v.problems() == [] and v.unified_memory and v.unified_gib == 121.6
    assert v.os.id == "ubuntu" and v.os.version_id == "24.04" and v.os.dgx["DGX_NAME"] == "DGX Spark"


def test_other_machines_are_not_taken_for_a_gb10():
    l40s = tuple(Gpus.parse(read("nvidia-smi-query-gpu-l40s.csv")))
    found = {what for what, _, _ in view(arch="x86_64", gpus=l40s).problems()}
    assert found == {"architecture", "GPU"}
    debian = OsRelease.parse(
        ['PRETTY_NAME="Debian GNU/Linux 13 (trixie)"', "ID=debian", 'VERSION_ID="13"', OsRelease.SEP]
    )
    assert [w for w, _, _ in view(os=debian).problems()] == ["operating system"]
    assert not debian.dgx
    # a discrete card with its own memory reported at 12.1 is not unified memory
    from roles.facts.system import Gpu

    assert [w for w, _, _ in view(gpus=(Gpu(0, "NVIDIA X", "12.1", 98304, "580.95.05"),)).problems()] == [
        "unified memory"
    ]
    assert [w for w, _, _ in view(mem_total_kib=64 * 1048576).problems()] == ["memory"]


GB10 = {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True}


@pytest.mark.parametrize(
    "over, words",
    [
        # beyond the checkpoint's max_position_embeddings: on every platform
        ({"max_model_len": 2_000_000_000}, "above the maximum 1048576"),
        # beyond what 0.90 of the 121.6 GiB holds beside the 99.6 GiB model (about 268K tokens)
        ({"max_model_len": 300_000}, "at most 268697"),
        # the field's 204,800 with less memory given to vLLM
        ({"gpu_memory_utilization": 0.85}, "leaves 3.8 GiB"),
    ],
)
def test_max_model_len_is_bounded_by_the_checkpoint_and_the_box(over, words):
    p = problems({**GB10, **over})
    assert list(p) == ["max_model_len"]
    assert words in p["max_model_len"].problem + p["max_model_len"].fix


def test_max_model_len_the_box_holds_passes():
    assert build("gx10", {**GB10, "max_model_len": 262144}, api_key_present=False).max_model_len == 262144
    more = build("gx10", {**GB10, "max_model_len": 400000, "gpu_memory_utilization": 0.95}, api_key_present=False)
    assert more.max_model_len == 400000


def test_a_huge_max_model_len_stops_pyinfra_before_any_host(tmp_path):
    inv = filled(
        "gb10.py",
        tmp_path,
        **{'"accept_drafter_license": True': '"accept_drafter_license": True, "max_model_len": 2000000000'},
    )
    r = load(inv, user_home(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no host was changed" in r.stderr and "gx10.lan: max_model_len" in r.stderr
