"""A fake-but-realistic GLM-5.3-Flash config.json and safetensors index.

The real checkpoint's config.json cannot be downloaded here (the hub is unreachable).
This one is built from the keys docs/sources.md §4 names (index_share_for_mtp_iteration at the
top level and in text_config, which wins) and the fields sglang-kt's configs/glm5_next.py
reads, with that file's defaults as values, written as transformers writes configs
(json.dumps indent=2, sort_keys=True). Nothing edits it: post1 is patched to accept the flags.
"""

import json

TEXT_CONFIG = {
    "model_type": "glm5_next_text",
    "vocab_size": 154880,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 45,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 1048576,
    "rms_norm_eps": 1e-05,
    "rope_theta": 800000.0,
    "n_routed_experts": 288,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "topk_method": "noaux_tc",
    "first_k_dense_replace": 3,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 256,
    "qk_rope_head_dim": 0,
    "v_head_dim": 256,
    "swiglu_limit": 10.0,
    "mhc": True,
    "hc_mult": 4,
    "num_nextn_predict_layers": 1,
    "index_topk": 2048,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_kpool": 4,
    "index_skip_topk_offset": None,
    "index_share_for_mtp_iteration": True,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}
CONFIG = {
    "architectures": ["Glm5NextForConditionalGeneration"],
    "model_type": "glm5_next",
    "index_share_for_mtp_iteration": True,
    "text_config": TEXT_CONFIG,
    "torch_dtype": "bfloat16",
    "transformers_version": "5.6.0",
}


def config_text(**overrides) -> str:
    data = json.loads(json.dumps(CONFIG))
    data.update(overrides)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_model(path, shards=2, **overrides):
    """config.json, model.safetensors.index.json and (tiny) shard files under path."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(config_text(**overrides))
    names = [f"model-{i:05d}-of-{shards:05d}.safetensors" for i in range(1, shards + 1)]
    index = {
        "metadata": {"total_size": 16 * shards},
        "weight_map": {f"model.layers.{i}.mlp.weight": n for i, n in enumerate(names)},
    }
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for n in names:
        (path / n).write_bytes(b"\0" * 16)
    return path
