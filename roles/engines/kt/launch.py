"""The L40S engine's command line and environment (KTransformers + SGLang-kt), from the profile.

The flags are the L40S field report's (docs/sources.md §1), plus what it left out but the engine
needs (docs/sources.md §5): --kt-weight-path, --kt-threadpool-count and the parsers.
"""

from __future__ import annotations

from collections.abc import Sequence

from control.profile import Profile
from roles.engines import common
from roles.engines.kt.triton_configs import moe_env
from roles.service import command_line
from roles.toolkit import toolkit_env

SGLANG_MODULE = "sglang.launch_server"


def kt_args(profile: Profile, numa_nodes: int) -> list[str]:
    p = profile
    return command_line(
        {
            "--model-path": p.model_path,
            **common.serving_flags(p),
            "--tp-size": p.tp_size,
            "--kt-method": p.kt_method,
            "--kt-weight-path": p.model_path,
            "--kt-cpuinfer": p.kt_cpuinfer,
            "--kt-threadpool-count": p.kt_threadpool_count or numa_nodes,
            "--kt-max-deferred-experts-per-token": p.kt_max_deferred_experts_per_token,
            "--kt-gpu-prefill-token-threshold": p.kt_gpu_prefill_token_threshold,
            "--chunked-prefill-size": p.chunked_prefill_size,
            "--max-mamba-cache-size": p.max_mamba_cache_size,
            "--mem-fraction-static": p.mem_fraction_static,
            "--context-length": p.context_length,
            "--kv-cache-dtype": p.kv_cache_dtype,
            "--tool-call-parser": p.tool_call_parser,
            "--reasoning-parser": p.reasoning_parser,
            # Prometheus metrics at /metrics on the API's port (roles/watch.py), not behind the key.
            **({"--enable-metrics": None} if p.metrics else {}),
        }
    )


def kt_env(profile: Profile, tuned: Sequence = ()) -> dict[str, str]:
    """The engine's environment; tuned: where the tuned Triton configs went (triton_configs.apply)."""
    # The engine's JIT compiles use the profile's toolkit, whatever /usr/local/cuda points to.
    env = {"SGLANG_KT_GLM5_NEXT_FP8_TRANSPORT": profile.kt_transport, **toolkit_env(profile), **moe_env(profile, tuned)}
    if profile.pytorch_alloc_conf:
        env["PYTORCH_ALLOC_CONF"] = env["PYTORCH_CUDA_ALLOC_CONF"] = profile.pytorch_alloc_conf
    return env


def launch_spec(profile: Profile, numa_nodes: int) -> dict:
    return common.launch_spec(profile, SGLANG_MODULE, kt_args(profile, numa_nodes))
