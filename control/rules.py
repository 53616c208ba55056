"""Checks across settings, as tables of `Rule`s (NixOS's `assertions`): those of every platform
(BEFORE, AFTER) and each platform's own (PLATFORM_RULES), run in that order by cross_checks()."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from control.problems import Problem

LOOPBACK = ("127.0.0.1", "::1", "localhost")  # a listen address nothing off this machine reaches


@dataclass(frozen=True)
class Rule:
    """One check across settings: where `broken(values)` holds, `key` is refused with `problem` and
    `fix` (each a text, or a function of the values that gives it)."""

    key: str
    broken: Callable[[dict[str, Any]], bool]
    problem: str | Callable[[dict[str, Any]], str]
    fix: str | Callable[[dict[str, Any]], str]

    def check(self, host: str, v: dict[str, Any]) -> Problem | None:
        if not self.broken(v):
            return None
        problem, fix = (x(v) if callable(x) else x for x in (self.problem, self.fix))
        return Problem(host, self.key, problem, fix)


def _python_source_lacks_python(v: dict[str, Any]) -> bool:
    src = v["python_source"]
    return bool(src) and not os.path.isfile(
        os.path.join(os.path.expanduser(src), "bin", "python" + v["python_version"])
    )


# The GB10 box's memory, from the field report (docs/sources.md §1): 121.6 GiB usable, the model
# (2-bit experts, the rest native, the drafter) 99.6 GiB, and a KV cache of at most 7.5 GiB for its
# 204,800-token context: about 38.4 KiB a token. What gpu_memory_utilization leaves beside the model
# bounds the context one stream can have; vLLM would refuse more only at the start, after the load.
GB10_USABLE_GIB = 121.6
GB10_MODEL_GIB = 99.6
GB10_KV_GIB_PER_TOKEN = 7.5 / 204800


def gb10_context_fits(v: dict[str, Any]) -> int:
    """The most tokens of KV cache the GB10's memory holds beside the model at gpu_memory_utilization."""
    room = GB10_USABLE_GIB * v["gpu_memory_utilization"] - GB10_MODEL_GIB
    return max(0, int(room / GB10_KV_GIB_PER_TOKEN))


def _runfile_name(v: dict[str, Any]) -> str:
    return v["cuda_runfile_url"].rsplit("/", 1)[-1]


def _token_in_clear(v: dict[str, Any]) -> str:
    """The hub token that a plain-http, non-loopback hf_endpoint would carry in clear, or ""."""
    endpoint = v["hf_endpoint"]
    if not endpoint.startswith("http://") or loopback_url(endpoint):
        return ""
    return "hf_token_vault" if v["hf_token_vault"] else v["hf_token_env"] if os.environ.get(v["hf_token_env"]) else ""


# Checked first, on every platform.
BEFORE = [
    Rule(
        "pytorch_alloc_conf",
        lambda v: (
            "expandable_segments:true" in (v["pytorch_alloc_conf"] or "").replace(" ", "").lower() and v["tp_size"] > 1
        ),
        "expandable_segments with tp_size > 1 breaks CUDA graph capture "
        "(custom all-reduce buffers cannot be IPC-exported)",
        "remove expandable_segments, or set tp_size: 1",
    ),
    Rule(
        "engine_extra_args",
        lambda v: bool(v["engine_extra_args"]) and not v["engine_extra_args"][0].startswith("--"),
        lambda v: f"{v['engine_extra_args'][0]!r} comes before any flag: a value needs its flag first",
        'start with the flag, e.g. ["--schedule-policy", "lpm"] or ["--schedule-policy=lpm"]',
    ),
]
# Per platform, in this order.
PLATFORM_RULES: dict[str, list[Rule]] = {
    "l40s": [
        Rule(
            "chunked_prefill_size",
            lambda v: v["gpu_compute_capability"] in ("8.6", "8.9") and v["chunked_prefill_size"] > 32768,
            lambda v: (
                f"{v['chunked_prefill_size']} runs out of memory on sm_86/sm_89 "
                "(the field report crashed at 40960 in the mHC fp32 fallback)"
            ),
            "use 32768 or less",
        ),
        Rule(
            "tp_size",
            lambda v: v["tp_size"] > v["gpu_count"] and v["require_gpu"],
            lambda v: f"{v['tp_size']} exceeds gpu_count {v['gpu_count']}",
            "set tp_size to at most the number of GPUs",
        ),
        Rule(
            "gpu_count",
            lambda v: v["require_gpu"] and v["gpu_count"] == 0,
            "0 GPUs with require_gpu true",
            "set gpu_count, or require_gpu: false for a test box",
        ),
        Rule(
            "cuda_graph_bs",
            lambda v: not any(b <= v["max_mamba_cache_size"] for b in v["cuda_graph_bs"]),
            lambda v: (
                f"every size is above max_mamba_cache_size {v['max_mamba_cache_size']}, "
                "so no CUDA graph would be captured"
            ),
            "include sizes up to max_mamba_cache_size",
        ),
        Rule(
            "kt_gpu_prefill_token_threshold",
            lambda v: v["kt_gpu_prefill_token_threshold"] > v["chunked_prefill_size"],
            "is larger than chunked_prefill_size, so GPU prefill never runs",
            "keep it at or below chunked_prefill_size",
        ),
        Rule(
            "python_release",
            lambda v: (
                not re.fullmatch(r"\d+\.\d+\.\d+", v["python_release"])
                or not v["python_release"].startswith(v["python_version"] + ".")
            ),
            lambda v: f"{v['python_release']!r} is not a CPython {v['python_version']}.N release",
            lambda v: (
                f"write a {v['python_version']}.N release that the pinned uv offers "
                f"(`uv python list --all-versions {v['python_version']}`)"
            ),
        ),
        Rule(
            "python_source",
            _python_source_lacks_python,
            lambda v: f"{v['python_source']!r} has no bin/python{v['python_version']} on the control machine",
            lambda v: (
                f"name a CPython {v['python_version']} install tree, e.g. ~/.pyenv/versions/{v['python_version']}.x"
            ),
        ),
        Rule(
            "cuda_runfile_url",
            lambda v: (
                v["driver_source"] == "nvidia-repo"
                and not re.fullmatch(
                    r"cuda_" + re.escape(v["cuda_version"]) + r"\.\d+_[0-9.]+_linux\.run", _runfile_name(v)
                )
            ),
            lambda v: (
                f"{_runfile_name(v)!r} is not NVIDIA's x86_64 runfile of CUDA {v['cuda_version']} "
                "(used when the repository has no cuda-toolkit package of that version)"
            ),
            lambda v: f"set cuda_runfile_url and cuda_runfile_sha256 to the cuda_{v['cuda_version']}.N runfile",
        ),
    ],
    "gb10": [
        Rule(
            "max_model_len",
            lambda v: v["max_model_len"] > gb10_context_fits(v),
            lambda v: (
                f"{v['max_model_len']} tokens do not fit: gpu_memory_utilization {v['gpu_memory_utilization']} of "
                f"{GB10_USABLE_GIB} GiB leaves {GB10_USABLE_GIB * v['gpu_memory_utilization'] - GB10_MODEL_GIB:.1f} GiB "
                f"beside the {GB10_MODEL_GIB} GiB model, about {gb10_context_fits(v)} tokens of KV cache "
                "(the field report: 7.5 GiB for 204,800)"
            ),
            lambda v: (
                f"set max_model_len to at most {gb10_context_fits(v)} (the field report ran 204800), "
                "or raise gpu_memory_utilization"
            ),
        ),
        Rule(
            "fork_patches",
            lambda v: not v["fork_patches"] or len(set(v["fork_patches"])) != len(v["fork_patches"]),
            lambda v: (
                "is empty: the fork is a series of patches on the release"
                if not v["fork_patches"]
                else f"names {sorted({p for p in v['fork_patches'] if v['fork_patches'].count(p) > 1})} twice"
            ),
            "list the fork's patches in the order they apply, each once (default: ['patch/vllm-moet-v0.24.0.patch'])",
        ),
        Rule(
            "scheduler_fix_verified_ref",
            lambda v: bool(v["scheduler_fix_verified_ref"]) and v["scheduler_fix_verified_ref"] != v["vllm_ref"],
            lambda v: (
                f"{v['scheduler_fix_verified_ref']} is not vllm_ref {v['vllm_ref']}: the override accepts the "
                "scheduler fix of the one fork commit you read by hand"
            ),
            "read the fix in the fork's patches at vllm_ref and set this to that same commit, or remove the key "
            "(the build then checks the fix by name)",
        ),
        Rule(
            "vllm_ref",
            lambda v: not v["vllm_ref"],
            "is empty; the GB10 engine is built from a pinned ref",
            "set vllm_ref to the commit of the vLLM-Moet fork to build",
        ),
        Rule(
            "accept_drafter_license",
            lambda v: not v["accept_drafter_license"],
            lambda v: (
                f"the drafter {v['drafter_model']} is licensed "
                "CC-BY-NC-ND-4.0 (attribution, non-commercial use only, no derivatives) and is downloaded "
                "only once that is accepted"
            ),
            "read https://creativecommons.org/licenses/by-nc-nd/4.0/, "
            "then set accept_drafter_license: true in this host's inventory entry",
        ),
    ],
}


def _bad_networks(v: dict[str, Any]) -> list[str]:
    """engine_allow_from entries (and the fleet's addresses) that ipaddress cannot parse."""
    bad = []
    for value in [*v["engine_allow_from"], v["fleet_gateway_address"], v["fleet_own_address"]]:
        try:
            if value:
                ipaddress.ip_network(value, strict=False)
        except ValueError:
            bad.append(value)
    return bad


# The CPU engine is the sandbox's: the L40S interpreter's rules, and never on a real node.
PLATFORM_RULES["cpu"] = [
    Rule(
        "platform",
        lambda v: v["require_gpu"],
        "cpu serves a tiny random model on vLLM's CPU build for the sandbox's tests; it is no GLM-5.3-Flash node",
        "use platform l40s or gb10 on a real host (cpu is for test boxes with require_gpu: false, "
        "inventory/sandbox_cpu.py)",
    ),
    *(r for r in PLATFORM_RULES["l40s"] if r.key in ("python_release", "python_source")),
]

# Checked last, on every platform.
AFTER = [
    Rule(
        "listen_host",
        lambda v: v["listen_host"] not in LOOPBACK and not v["_api_key_present"],
        lambda v: f"{v['listen_host']} exposes the engine without an API key",
        lambda v: f"export {v['api_key_env']} on the control machine, or keep listen_host: 127.0.0.1",
    ),
    Rule(
        "engine_allow_from",
        lambda v: bool(_bad_networks(v)),
        lambda v: f"{', '.join(map(repr, _bad_networks(v)))} is not an IP address or network",
        "write addresses as 10.0.0.5 or fd00::5 and networks as 10.0.0.0/24",
    ),
    Rule(
        "hf_endpoint",
        lambda v: bool(_token_in_clear(v)),
        lambda v: (
            f"{v['hf_endpoint']} is plain http and a Hugging Face token is set ({_token_in_clear(v)}): "
            "it would travel in clear"
        ),
        "use the hub's https:// address, or unset the token for a mirror that needs none",
    ),
]


def cross_checks(host: str, v: dict[str, Any]) -> Iterable[Problem]:
    """Settings that contradict each other or what the field report measured: the rules above,
    those of every platform and those of the host's own."""
    for rule in [*BEFORE, *PLATFORM_RULES.get(v["platform"], []), *AFTER]:
        problem = rule.check(host, v)
        if problem:
            yield problem


def loopback_url(url: str) -> bool:
    """A URL whose host is this machine's loopback: nothing sent there crosses a network."""
    host = re.sub(r"^[a-z]+://", "", url).split("/", 1)[0]
    host = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
    return host in ("localhost", "::1") or re.fullmatch(r"127(?:\.[0-9]{1,3}){3}", host) is not None
