"""Profile validation: defaults, platform overlays, and the mistakes users make."""

import re

import pytest

from control.defaults import KNOBS, PLATFORMS
from control.profile import ProfileError, build
from control.rules import AFTER, BEFORE, PLATFORM_RULES


def problems(data, **kw):
    with pytest.raises(ProfileError) as e:
        build("gpu1", data, **kw)
    return e.value.problems


def test_defaults_are_the_field_reports_best_configuration():
    p = build("gpu1", {})
    assert (p.platform, p.tp_size, p.kt_cpuinfer, p.kt_max_deferred_experts_per_token) == ("l40s", 2, 152, 4)
    assert (p.kt_gpu_prefill_token_threshold, p.chunked_prefill_size, p.max_mamba_cache_size) == (2048, 32768, 16)
    assert (p.mem_fraction_static, p.context_length, p.kv_cache_dtype) == (0.55, 524288, "fp8_e4m3")
    assert (p.kt_transport, p.engine_set, p.cuda_version, p.listen_host) == (
        "native",
        "0.7.0.post1",
        "12.8",
        "127.0.0.1",
    )


def test_every_knob_says_why_and_its_default_is_valid():
    for key, knob in KNOBS.items():
        assert len(knob.why) > 10, key
    build("gpu1", {})  # all defaults pass their own checks


def test_inventory_overrides_and_platform_overlay():
    p = build(
        "spark",
        {
            "platform": "gb10",
            "vllm_ref": "0123456789abcdef0123456789abcdef01234567",
            "max_num_seqs": 2,
            "accept_drafter_license": True,
        },
    )
    assert (p.tp_size, p.driver_source, p.gpu_compute_capability, p.port) == (1, "preinstalled", "12.1", 8000)
    assert p.max_num_seqs == 2 and p.kt_cpuinfer == 152


def test_connection_keys_pass_through():
    build("gpu1", {"ssh_user": "admin", "ssh_port": 2200, "_sudo": True})


@pytest.mark.parametrize(
    "data, key, words",
    [
        ({"tp_szie": 2}, "tp_szie", "did you mean 'tp_size'"),
        ({"flux_capacitor": 1}, "flux_capacitor", "control/defaults.py lists every key"),
        ({"tp_size": "2"}, "tp_size", "expected a whole number"),
        ({"tp_size": True}, "tp_size", "expected a whole number"),
        ({"headless": "yes"}, "headless", "expected true or false"),
        ({"kt_transport": "Native"}, "kt_transport", "did you mean 'native'"),
        ({"engine_set": "0.8"}, "engine_set", "is not one of"),
        ({"port": 70000}, "port", "above the maximum"),
        ({"mem_fraction_static": 0}, "mem_fraction_static", "below the minimum"),
        ({"tp_size": None}, "tp_size", "must not be None"),
        ({"chunked_prefill_size": 40960}, "chunked_prefill_size", "runs out of memory"),
        ({"pytorch_alloc_conf": "expandable_segments:True"}, "pytorch_alloc_conf", "breaks CUDA graph capture"),
        ({"tp_size": 4}, "tp_size", "exceeds gpu_count 2"),
        ({"gpu_compute_capability": "9.0"}, "gpu_compute_capability", "rejects sm_90"),
        ({"driver_source": "debian"}, "driver_source", "'debian' is not one of 'nvidia-repo', 'preinstalled'"),
        ({"cuda_graph_bs": [32, 64]}, "cuda_graph_bs", "no CUDA graph would be captured"),
        ({"cuda_graph_bs": [1, "2"]}, "cuda_graph_bs", "item 2, '2', is str, expected a whole number"),
        ({"cuda_graph_bs": [0, 2]}, "cuda_graph_bs", "0 in [0, 2] is below the minimum 1"),
        ({"cuda_graph_bs": [1, True]}, "cuda_graph_bs", "item 2, True, is bool"),
        ({"kt_gpu_prefill_token_threshold": 65536}, "kt_gpu_prefill_token_threshold", "GPU prefill never runs"),
        ({"install_root": "opt/glm"}, "install_root", "not an absolute path"),
        ({"service_user": "root"}, "service_user", "must not run as root"),
        ({"platform": "gb10", "accept_drafter_license": True}, "vllm_ref", "pinned ref"),
        (
            {
                "platform": "gb10",
                "vllm_ref": "0123456789abcdef0123456789abcdef01234567",
                "driver_source": "nvidia-repo",
                "accept_drafter_license": True,
            },
            "driver_source",
            "DGX OS",
        ),
        ({"platform": "tpu"}, "platform", "is not one of"),
    ],
)
def test_mistakes_name_key_problem_and_fix(data, key, words):
    found = problems(data)
    assert len(found) == 1, found
    assert found[0].host == "gpu1" and found[0].key == key
    assert words in str(found[0]) and found[0].fix


def test_expandable_segments_is_fine_on_one_gpu():
    build("gpu1", {"pytorch_alloc_conf": "expandable_segments:True", "tp_size": 1})


def test_public_listen_address_needs_an_api_key():
    (p,) = problems({"listen_host": "0.0.0.0"}, api_key_present=False)
    assert p.key == "listen_host" and "GLM_FLASH_API_KEY" in p.fix
    build("gpu1", {"listen_host": "0.0.0.0"}, api_key_present=True)


def test_api_key_presence_is_read_from_the_control_machine(monkeypatch):
    monkeypatch.delenv("GLM_FLASH_API_KEY", raising=False)
    problems({"listen_host": "0.0.0.0"})
    monkeypatch.setenv("GLM_FLASH_API_KEY", "k")
    build("gpu1", {"listen_host": "0.0.0.0"})


def test_all_problems_are_reported_at_once():
    found = problems({"tp_szie": 2, "port": "80", "kv_cache_dtype": "fp16"})
    assert [p.key for p in found] == ["tp_szie", "port", "kv_cache_dtype"]


def test_profile_is_read_only():
    p = build("gpu1", {})
    with pytest.raises(AttributeError):
        p.tp_size = 4


def test_gpus_that_do_not_match_the_profile_are_named():
    from roles.facts.driver import PciDevice
    from roles.facts.system import Gpu
    from roles.operations.hardware import mismatches

    l40s = [Gpu(i, "NVIDIA L40S", "8.9", 46068, "580.95.05") for i in range(2)]
    pci = [PciDevice(f"0000:0{i}:00.0", "0x26b9", "0x030200") for i in range(2)]
    assert mismatches("gpu1", 2, "8.9", True, l40s, pci) == []
    (one,) = mismatches("gpu1", 2, "8.9", True, l40s[:1], pci[:1])
    assert one.key == "gpu_count" and "shows 1" in one.problem
    a6000 = [Gpu(i, "NVIDIA RTX A6000", "8.6", 49140, "580.95.05") for i in range(2)]
    (cap,) = mismatches("gpu1", 2, "8.9", True, a6000, pci)
    assert cap.key == "gpu_compute_capability" and "report 8.6" in cap.problem
    # before any driver: the PCI bus counts, unless the box is a test box without GPUs
    (bus,) = mismatches("gpu1", 2, "8.9", True, [], pci[:1])
    assert bus.key == "gpu_count" and "PCI bus shows 1" in bus.problem and bus.host == "gpu1"
    assert mismatches("gpu1", 2, "8.9", True, [], pci) == []
    assert mismatches("sandbox", 2, "8.9", False, [], []) == []


def test_cross_check_rules_name_knobs_and_platforms():
    """The rule tables of control/rules.py: each rule refuses a knob, each table is a platform's."""
    assert set(PLATFORM_RULES) <= set(PLATFORMS)
    rules = [*BEFORE, *AFTER, *(r for table in PLATFORM_RULES.values() for r in table)]
    # 20 refusals: five that check one knob alone moved into that knob's shape (issue #19); one
    # parses engine_allow_from and the fleet's addresses as IP networks (issue #22); one bounds the
    # GB10's max_model_len by the KV cache its memory holds beside the model, one refuses an empty or
    # repeating fork_patches series, one a scheduler-fix override for another commit (issue #37); one
    # refuses platform cpu where a GPU is required, whose table also holds the L40S's two interpreter
    # rules (issue #34); driver_source 'debian' is no longer a choice, so its rule went (issue #38)
    shaped = [
        KNOBS["cuda_graph_bs"].items is int and KNOBS["cuda_graph_bs"].low == 1,
        re.fullmatch(KNOBS["service_user"].pattern, "root") is None,
        KNOBS["context_length"].platforms["l40s"].high == 1048576,
        KNOBS["driver_source"].platforms["gb10"].choices == ("preinstalled",),
        "9.0" not in KNOBS["gpu_compute_capability"].platforms["l40s"].choices,
        "debian" not in KNOBS["driver_source"].choices,
    ]
    assert all(shaped) and len(rules) + len(shaped) == 27
    assert [r.key for r in rules if r.key not in KNOBS] == []


@pytest.mark.parametrize(
    "argv, env, dry",
    [
        (["--json", "inv.py", "deploy.py"], {}, True),  # pyinfra stops before executing: nothing changes
        (["--json", "-y", "inv.py", "deploy.py"], {}, False),
        (["--json", "inv.py", "deploy.py"], {"PYINFRA_YES": "1"}, False),  # pyinfra reads it as -y
        (["--json", "inv.py", "deploy.py"], {"PYINFRA_YES": "true"}, False),
        (["--json", "inv.py", "deploy.py"], {"PYINFRA_YES": "0"}, True),
        (["--dry", "inv.py", "deploy.py"], {"PYINFRA_YES": "1"}, True),
    ],
)
def test_dry_run_reads_yes_as_pyinfra_does(argv, env, dry):
    from control.run import dry_run

    assert dry_run(argv, env) is dry
