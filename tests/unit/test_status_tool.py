"""files/glm-flash (status): its parsers and ok / problem / n-a decisions, fed with output the
host tools really printed (tests/unit/data/status/, captured on the deployed sandbox and, for
nvidia-smi, on the field boxes) and with that output changed where a host would differ."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from control.defaults import KNOBS, PLATFORMS
from tests.conftest import host_tool

REPO = Path(__file__).resolve().parent.parent.parent
DATA = Path(__file__).resolve().parent / "data"


def _load():
    return host_tool("glm-flash", "glm_flash_status")


st = _load()


def data(name: str) -> str:
    return (DATA / name).read_text()


def cfg(platform: str = "l40s", **over) -> dict:
    """The status.json values of a profile (roles/status.py writes the same keys)."""
    from roles.status import KEYS

    values = {k: PLATFORMS[platform].get(k, KNOBS[k].default) for k in KEYS}
    values.update(
        platform=platform,
        nvidia_keyring="/etc/apt/keyrings/glm-flash-nvidia-cuda.gpg",
        nvidia_sources="/etc/apt/sources.list.d/glm-flash-nvidia-cuda.sources",
        **over,
    )
    return values


SANDBOX = dict(
    require_gpu=False,
    model_download=False,
    nvidia_repo_key_fingerprint=json.loads(data("status/nvidia-repo-status.json"))["fingerprints"][0],
)


# --- GPUs, driver, persistence, modules ---------------------------------------------------------


def test_gpus_of_the_l40s_box_are_ok_and_a_missing_one_is_a_problem():
    gpus = st.parse_gpus(data("nvidia-smi-query-gpu-l40s.csv"))
    assert st.decide_gpus(cfg(), 2, gpus)["state"] == "ok"
    one = st.decide_gpus(cfg(), 2, gpus[:1])
    assert one["state"] == "problem" and "expects 2" in one["detail"] and one["fix"]
    assert st.decide_gpus(cfg(), 2, [])["state"] == "problem"  # on the bus, but the driver answers none


def test_no_gpu_is_not_applicable_only_where_the_profile_allows_it():
    na = st.decide_gpus(cfg(require_gpu=False), 0, [])
    assert na["state"] == "n/a" and "no NVIDIA GPU" in na["detail"] and not na["fix"]
    assert st.decide_gpus(cfg(), 0, [])["state"] == "problem"
    assert st.decide_persistence(cfg(require_gpu=False), [], [])["state"] == "n/a"
    assert st.decide_modules(cfg(), False, {"6.12.48+deb13-amd64": None})["state"] == "n/a"
    assert st.decide_service(False, "enabled", "failed")["state"] == "n/a"
    assert st.decide_ready(False, "failed", None, "")["state"] == "n/a"


def test_gb10_driver_is_checked_against_its_minimum():
    gpus = st.parse_gpus(data("gb10-nvidia-smi-query-gpu.csv"))
    assert gpus == [{"index": 0, "name": "NVIDIA GB10", "cap": "12.1", "driver": "580.95.05"}]
    assert st.decide_gpus(cfg("gb10"), 1, gpus)["state"] == "ok"
    assert st.decide_driver(cfg("gb10"), gpus, {})["state"] == "ok"
    old = st.decide_driver(cfg("gb10", driver_min_version="590.0"), gpus, {})
    assert old["state"] == "problem" and "older" in old["detail"]


def test_driver_branch_from_the_installed_packages_and_the_loaded_module():
    packages = st.parse_driver_packages(data("status/dpkg-query-driver.txt"))
    assert packages and all(v.startswith("590.") for v in packages.values())
    assert st.decide_driver(cfg(), [], packages)["state"] == "ok"
    assert st.decide_driver(cfg(driver_branch="595"), [], packages)["state"] == "problem"
    field = st.parse_gpus(data("nvidia-smi-query-gpu-l40s.csv"))  # the field box ran 580
    running = st.decide_driver(cfg(driver_branch="580"), field, {p: "580.95.05-1" for p in packages})
    assert running["state"] == "ok"
    reboot = st.decide_driver(cfg(), field, packages)
    assert reboot["state"] == "problem" and "reboot" in reboot["fix"]


def test_persistence_mode():
    gpus = st.parse_gpus(data("nvidia-smi-query-gpu-l40s.csv"))
    assert st.decide_persistence(cfg(), gpus, ["Enabled", "Enabled"])["state"] == "ok"
    off = st.decide_persistence(cfg(), gpus, ["Enabled", "Disabled"])
    assert off["state"] == "problem" and "nvidia-persistenced" in off["fix"]


def test_a_kernel_without_the_module_is_a_problem_with_its_dkms_command():
    missing = st.module_version(data("status/modinfo-missing.txt"))
    assert missing is None
    kernels = {"6.12.48+deb13-amd64": "590.48.01", "6.12.57+deb13-amd64": missing}
    it = st.decide_modules(cfg(), True, kernels)
    assert it["state"] == "problem" and it["fix"].startswith("dkms autoinstall -k 6.12.57+deb13-amd64")
    assert st.module_version("590.48.01\n") == "590.48.01"
    # an older kernel without headers (from before an upgrade): named, not a problem; the deploy skips it
    older = {"6.12.30+deb13-amd64": None, "6.12.48+deb13-amd64": "590.48.01"}
    it = st.decide_modules(cfg(), True, older, headers={"6.12.48+deb13-amd64"})
    assert it["state"] == "ok" and it["detail"].endswith("; not built, no headers: 6.12.30+deb13-amd64")
    # the newest kernel (the one the box boots) without the module stays a problem, headers or not
    assert st.decide_modules(cfg(), True, kernels, headers={"6.12.48+deb13-amd64"})["state"] == "problem"


# --- repository, CUDA ------------------------------------------------------------------------------


def test_nvidia_repository_key():
    state = json.loads(data("status/nvidia-repo-status.json"))
    assert st.decide_repo(cfg(**SANDBOX), 0, state)["state"] == "ok"
    other = st.decide_repo(cfg(), 0, state)  # NVIDIA's real fingerprint: the stand-in key is not it
    assert other["state"] == "problem" and "want only" in other["detail"]
    assert st.decide_repo(cfg(**SANDBOX), 0, dict(state, sources_current=False))["state"] == "problem"
    assert st.decide_repo(cfg("gb10"), None, None)["state"] == "n/a"


def test_cuda_header_fix_exit_codes():
    out = data("status/fix-cuda-header-check.txt")
    assert st.decide_header(cfg(), 0, out)["state"] == "ok"
    needs = st.decide_header(cfg(), 1, out.replace("fixed    ", "needs fix"))
    assert needs["state"] == "problem" and needs["fix"] == "glm-flash-fix-cuda-header"
    refused = st.decide_header(cfg(), 2, "glm-flash-fix-cuda-header: refused")
    assert refused["state"] == "problem" and "restore the original header" in refused["fix"]
    assert st.decide_header(cfg("gb10"), None, "")["state"] == "n/a"


def test_toolkit_version_from_nvcc():
    out = data("status/nvcc-version.txt")
    assert st.decide_toolkit(cfg(), out)["state"] == "ok"
    assert st.decide_toolkit(cfg(cuda_version="12.9"), out)["state"] == "problem"
    assert st.decide_toolkit(cfg(), None)["fix"].startswith("run the deploy")


# --- engine, patches, model ----------------------------------------------------------------------


def test_engine_set_and_cudnn():
    state = st.last_json(data("status/engine-status.json"))
    assert st.decide_engine(cfg(), 0, state)["state"] == "ok"
    other = st.decide_engine(cfg(engine_set="0.7.2"), 0, state)
    assert other["state"] == "problem" and "not engine_set 0.7.2" in other["detail"]
    cudnn = st.decide_engine(cfg(), 0, dict(state, cudnn="9.10.2.21"))
    assert cudnn["state"] == "problem" and "assert-pin" in cudnn["fix"] and "nvidia-cudnn-cu12" in cudnn["fix"]
    broken = dict(state, envs={k: "incomplete" for k in state["envs"]})
    assert st.decide_engine(cfg(), 0, broken)["state"] == "problem"


def test_engine_environment_verify():
    current = st.last_json(data("status/engine-status.json"))["current"]
    assert st.decide_engine_env(0, st.last_json(data("status/engine-verify-full.json")), current)["state"] == "ok"
    drift = st.decide_engine_env(1, st.last_json(data("status/engine-verify-full-drift.json")), current)
    assert drift["state"] == "problem" and "files differ from RECORD" in drift["detail"]
    assert f"glm-flash-engine assert-pin {current} sglang-kt --force" in drift["fix"]
    gb10 = st.decide_engine_env(None, None, "vllm-moet-0123456789ab-01234567", "gb10")
    assert gb10["state"] == "n/a" and "L40S only" in gb10["detail"]


def test_patch_sets():
    out = data("status/patch-check.json")
    files = st.last_json(out)
    it = st.decide_patches(0, files, out)
    assert it["state"] == "ok" and "sglang-kt" in it["detail"]
    drift = copy.deepcopy(files)
    path = sorted(drift)[0]
    drift[path].update(state="drift", reason="anchor not found")
    bad = st.decide_patches(2, drift, out)
    assert bad["state"] == "problem" and path in bad["detail"] and "restore the original" in bad["fix"]
    assert st.decide_patches(1, {path: dict(files[path], state="pending")}, "")["fix"].startswith("run the deploy")
    assert st.decide_patches(None, None, "")["state"] == "problem"


def test_patch_sets_without_a_check_are_na_only_where_the_engine_has_none():
    assert st.no_patch_check("gb10")["state"] == st.NA
    assert st.no_patch_check("cpu")["state"] == st.NA  # make demo's CPU engine: it reported a problem
    assert st.no_patch_check("l40s")["state"] == st.PROBLEM


def test_model():
    state = st.last_json(data("status/model-check.json"))
    assert st.decide_model(cfg(**SANDBOX), 0, state)["state"] == "ok"
    gone = st.last_json(data("status/model-check-missing.json"))
    it = st.decide_model(cfg(**SANDBOX), 1, gone)
    assert it["state"] == "problem" and "does not exist" in it["detail"] and "stage the checkpoint" in it["fix"]
    assert st.decide_model(cfg(), 1, gone)["fix"].startswith("run the deploy")


def test_the_summary_reads_fields_not_the_detail_text():
    """The deploy's summary takes the engine's current environment and the model's commit from
    the fields `glm-flash status --json` emits; a detail worded differently changes nothing, and
    an item without the field gives None rather than a guess."""
    from roles.summary import host_summary

    state = st.last_json(data("status/engine-status.json"))
    engine = st.decide_engine(cfg(), 0, state)
    assert engine["fields"] == {"current": state["current"], "previous": state.get("previous")}
    model = st.decide_model(cfg(**SANDBOX), 0, st.last_json(data("status/model-check.json")))
    assert model["fields"]["commit"] and model["fields"]["commit"] in model["detail"]
    reworded = [dict(engine, detail="env is elsewhere, current other-env;"), dict(model, detail="commit deadbeef")]
    s = host_summary({}, {"items": reworded}, [])
    assert s["environment"] == state["current"] and s["model_commit"] == model["fields"]["commit"]
    bare = [{k: v for k, v in it.items() if k != "fields"} for it in (engine, model)]
    s = host_summary({}, {"items": bare}, [])
    assert s["environment"] is None and s["model_commit"] is None


# --- service, readiness, disk, output --------------------------------------------------------------


def test_memory_guard_item():
    """earlyoom's command line as /proc/PID/cmdline splits it (roles/memory_guard.py writes it)."""
    gb10 = cfg("gb10")
    assert gb10["memory_guard_gib"] == 4.0 and cfg()["memory_guard_gib"] == 0.0
    argv = ["/usr/bin/earlyoom", "-M", "4194304,2097152", "-s", "100,100", "-r", "3600", "--avoid", "^(sshd)$", ""]
    ok = st.decide_memory_guard(gb10, "active", argv)
    assert ok["state"] == "ok" and "below 4 GiB" in ok["detail"]
    stopped = st.decide_memory_guard(gb10, "inactive", [])
    assert stopped["state"] == "problem" and "earlyoom.service is inactive" in stopped["detail"]
    # the package's own command line (-m 10 by default), not the deploy's drop-in
    other = st.decide_memory_guard(gb10, "active", ["/usr/bin/earlyoom", ""])
    assert other["state"] == "problem" and "-M None" in other["detail"] and "-M 4194304,2097152" in other["detail"]
    assert st.decide_memory_guard(cfg(), "", [])["state"] == "n/a"
    assert st.decide_memory_guard({}, "", [])["state"] == "n/a"  # a status.json written before the knob


def test_service_and_readiness():
    assert st.decide_service(True, "enabled", "active")["state"] == "ok"
    off = st.decide_service(False, "disabled", "inactive")
    assert off["state"] == "problem" and off["fix"] == "systemctl enable --now glm-flash.service"
    assert st.decide_service(True, "enabled", "failed")["state"] == "problem"
    assert st.decide_ready(True, "active", 0, "glm-flash: ready, glm-5.3-flash answered: {}")["state"] == "ok"
    no = st.decide_ready(True, "active", 1, "glm-flash: no completion from http://127.0.0.1:30000 (timed out)")
    assert no["state"] == "problem" and "journalctl" in no["fix"]


def test_gpu_check():
    def out(*parts):
        return json.dumps({"parts": [{"part": p, "state": state, "detail": d} for p, state, d in parts]})

    na = st.decide_gpu_check(0, out(("toolchain", "pass", "ninja 1.11.1"), ("cuda", "n/a", "no NVIDIA GPU")))
    assert na["state"] == "n/a" and "cuda: no NVIDIA GPU" in na["detail"]  # never ok without a GPU
    ok = st.decide_gpu_check(0, out(("toolchain", "pass", "ninja"), ("cuda", "pass", "GPU 0 sm_89 fp8")))
    assert ok["state"] == "ok"
    bad = st.decide_gpu_check(
        1, out(("toolchain", "fail", "ninja is not on the unit's PATH (/usr/bin)"), ("cuda", "n/a", "no GPU"))
    )
    assert bad["state"] == "problem" and bad["detail"] == "toolchain: ninja is not on the unit's PATH (/usr/bin)"
    assert "glm-flash-gpu-check run" in bad["fix"]
    assert st.decide_gpu_check(1, "Failed to start transient service unit")["state"] == "problem"


def test_disk():
    assert st.decide_disk({"/": 400 << 30})["state"] == "ok"
    low = st.decide_disk({"/": 400 << 30, "/srv": 3 << 30})
    assert low["state"] == "problem" and "/srv" in low["fix"]


def test_text_output_one_line_per_item_with_the_fix():
    items = [st.item("a", "ok", "fine"), st.item("b", "problem", "broken", "do x"), st.item("c", "n/a", "why")]
    assert st.render(items).splitlines() == ["ok       a: fine", "PROBLEM  b: broken Fix: do x", "n/a      c: why"]
    assert st.item("a", "ok", "fine", "ignored")["fix"] == ""


def test_profile_values_are_those_the_tool_reads(tmp_path):
    from control.profile import build
    from roles.status import values

    v = values(build("node1", {}))
    assert {"driver_branch", "cudnn_version", "nvidia_keyring", "model_path"} <= set(v)
    assert not [k for k in v if "token" in k or "api_key" in k]
    link = tmp_path / "status.json"
    link.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(v))
    with pytest.raises(OSError):
        st.load_config(str(link))  # a planted symlink is never followed


def test_gb10_deepgemm_is_the_pinned_commit_installed_once():
    """The serving environment's record names deepgemm_ref and deep_gemm is installed once, its
    version's +<rev> (DeepGEMM's setup.py appends `git rev-parse --short HEAD`) naming that commit."""
    gb10 = cfg("gb10")
    want = gb10["deepgemm_ref"]
    assert want == KNOBS["deepgemm_ref"].default
    marker = {"deepgemm_commit": want, "deep_gemm": "2.3.0+a6b593d"}
    ok = st.decide_deepgemm(gb10, marker, ["2.3.0+a6b593d"])
    assert ok["state"] == "ok" and ok["fields"] == {"version": "2.3.0+a6b593d", "commit": want}
    assert st.decide_deepgemm(gb10, marker, ["2.3.0"])["state"] == "ok"  # built without a local version
    other = st.decide_deepgemm(gb10, dict(marker, deepgemm_commit="1" * 40), ["2.3.0+1111111"])
    assert other["state"] == "problem" and "the profile pins" in other["detail"]
    assert st.decide_deepgemm(gb10, marker, ["2.3.0+1111111"])["state"] == "problem"
    assert st.decide_deepgemm(gb10, marker, [])["state"] == "problem"
    assert st.decide_deepgemm(gb10, marker, ["2.3.0+a6b593d", "2.2.0"])["state"] == "problem"
    assert st.decide_deepgemm(gb10, None, [])["state"] == "problem"
