"""The GB10 engine's command line and environment (vLLM 0.24.0 with the vLLM-Moet fork's patch).

Every flag is checked against vLLM 0.24.0's own serve parser in tests/gb10/test_vllm_args.py, and on
the host against the patched engine's parser before each switch (roles/engines/flag_check.py).
Values are the GB10 field report's (docs/sources.md §1) and docs/sources.md §8:
- 204,800-token context, one stream at a time (DFlash2 k=7 leaves room for one);
- prefix caching with `--mamba-cache-mode align` (the KDA state is checkpointed per block);
- the DFlash2 drafter, 7 speculative tokens, from its local download (the host serves offline);
- `reasoning_effort` low as the server default (`--default-chat-template-kwargs`);
- a thinking budget for requests that set none: vLLM has no server-side default for
  `thinking_token_budget`, so a pure-ASGI middleware (files/glm_flash_defaults.py, loaded
  with `--middleware`) adds it to chat/completion requests that lack it. One process, one
  port, no proxy; the value comes from the unit's environment;
- memory for 121.6 GiB of unified memory: gpu_memory_utilization of the total (model 99.6 GiB
  + KV 6-7.5 GiB), safetensors memory-mapped (`lazy`, no prefetch into the page cache that
  competes with CUDA allocations there), the page cache flushed before start (unit, knob
  drop_page_cache).
"""

from __future__ import annotations

import json

from control.layout import engine_root, moe_store_dir
from control.profile import Profile
from roles.engines import common
from roles.service import command_line
from roles.toolkit import toolkit_env

# `python -m` entry of the OpenAI server of vLLM 0.24.0, the release the fork patches
# (vllm/entrypoints/openai/api_server.py, `if __name__ == "__main__"`; 0.24.0 has no
# vllm/entrypoints/launchers/, docs/sources.md §20).
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
MIDDLEWARE_MODULE = "glm_flash_defaults"
MIDDLEWARE = f"{MIDDLEWARE_MODULE}.ThinkingBudgetDefault"
BUDGET_ENV = "GLM_FLASH_DEFAULT_THINKING_TOKEN_BUDGET"


def speculative_config(profile: Profile) -> dict:
    return {"method": "dflash", "model": profile.drafter_path, "num_speculative_tokens": profile.num_speculative_tokens}


def vllm_flags(profile: Profile) -> dict:
    p = profile
    return {
        "--model": p.model_path,
        **common.serving_flags(p),
        "--tensor-parallel-size": p.tp_size,
        "--max-model-len": p.max_model_len,
        "--max-num-seqs": p.max_num_seqs,
        "--gpu-memory-utilization": p.gpu_memory_utilization,
        "--safetensors-load-strategy": "lazy",
        "--enable-prefix-caching": None,
        "--mamba-cache-mode": p.mamba_cache_mode,
        "--speculative-config": json.dumps(speculative_config(p), separators=(",", ":")),
        "--reasoning-parser": p.reasoning_parser,
        "--tool-call-parser": p.tool_call_parser,
        "--enable-auto-tool-choice": None,
        "--default-chat-template-kwargs": json.dumps({"reasoning_effort": p.reasoning_effort}, separators=(",", ":")),
        "--middleware": MIDDLEWARE,
    }


def vllm_args(profile: Profile) -> list[str]:
    return command_line(vllm_flags(profile))


CUBIT_DIR = "cubit-share"  # the fork's kernels, copied into each engine environment (follows `current`)


def vllm_env(profile: Profile) -> dict[str, str]:
    """The service's environment: the fork's runtime knobs (docs/sources.md §20) and ours."""
    p = profile
    env = {
        BUDGET_ENV: str(p.thinking_token_budget),
        "VLLM_MOE_W2": "1" if p.moe_w2 else "0",
        "VLLM_MOE_W2_DELTA_GB": f"{p.moe_w2_delta_gb:g}",
        "VLLM_MOE_W2_GATE": "1" if p.moe_w2_gate else "0",
        "VLLM_MOE_W2_CUBIT_DIR": f"{engine_root(p)}/current/{CUBIT_DIR}",
        # the box serves what is on disk; the drafter and model are downloaded by the deploy
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if p.moe_w2_store:
        env["VLLM_MOE_W2_STORE_DIR"] = moe_store_dir(p)
    # DGX OS's CUDA 13.0 by path, as on the L40S: flashinfer's, DeepGEMM's and tilelang's JIT builds
    # find nvcc through CUDA_HOME and PATH, never through the /usr/local/cuda link.
    env.update(toolkit_env(p))
    return env


def engine_env_names(profile: Profile) -> list[str]:
    """The unit's settings the engine itself must read (the fork's VLLM_MOE_W2*, vLLM's own):
    checked on the host against the patched engine (files/glm-flash-check-flags)."""
    return sorted(k for k in vllm_env(profile) if k.startswith("VLLM_"))


def launch_spec(profile: Profile) -> dict:
    return common.launch_spec(profile, VLLM_MODULE, vllm_args(profile))
