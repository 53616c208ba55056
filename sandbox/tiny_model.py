"""A tiny Llama the CPU engine serves in the sandbox (inventory/sandbox_cpu.py): made here, in code,
deterministically, in about a second, with the standard library only.

What it is (what vLLM and transformers read; nothing of GLM-5.3-Flash):
- config.json: `LlamaForCausalLM`, hidden 128, 2 layers, 4 heads, 2 KV heads, head_dim 32,
  intermediate 256, 32,768 positions, bf16, embeddings not tied, a vocab exactly the tokenizer's
  (every id the model can emit decodes to text; a stream of ids that decode to nothing is "no
  token" to the bench): about 475,000 parameters;
- its weights: normal(0, 0.02) from a fixed seed, the norms 1.0, the output rows of the special
  tokens 0 (so greedy decoding emits text, not end-of-turn), as bf16 in one safetensors shard
  named by model.safetensors.index.json (the layout glm-flash-model-fetch checks);
- a byte-level BPE tokenizer (tokenizer.json, what the `tokenizers` library loads), its merges
  learned here from generated text (up to MAX_VOCAB), with ChatML's tokens and a ChatML chat
  template, and the special tokens GLM's parsers look for (`<think>`, `</think>`, `<tool_call>`,
  `<arg_key>`, `<arg_value>` and their closers), so `--reasoning-parser glm45` and
  `--tool-call-parser glm47` load.
Random weights answer gibberish, the same gibberish for the same greedy request.

    python3 sandbox/tiny_model.py DIR
"""

from __future__ import annotations

import array
import json
import random
import re
import struct
import sys
from collections import Counter
from pathlib import Path

SEED = 34
HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, MAX_VOCAB = 128, 2, 4, 2, 32, 256, 1024
SPECIAL = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
]
EOS = "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# GPT-2's pre-tokenizer (what ByteLevel(use_regex=True) splits on), with Python's classes for \p{L}, \p{N}.
WORDS = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?[^\s\w]+|\s+(?!\S)|\s+""")


def byte_chars() -> list[str]:
    """GPT-2's byte-to-character table: byte b is the character at index b."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def corpus(rng: random.Random) -> str:
    """Generated text: English-like sentences and small Python functions, as the bench and eval send."""
    words = (
        "the a of to and in is it that for on with as was be at by this from or an are not have "
        "reply with ok hello say write function return value list number string python code def "
        "if else for while true false none print range len self class import test result"
    ).split()
    lines = []
    for i in range(400):
        lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(4, 12))).capitalize() + ".")
        if i % 4 == 0:
            name = rng.choice(words)
            lines.append(f"def {name}_{i}(n):\n    return n * {i} + len('{name}')\n")
    return "\n".join(lines)


def train_merges(text: str, chars: list[str], size: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges learned from `text` until 256 + merges reach `size` (ties: first in order)."""
    counts = Counter("".join(chars[b] for b in w.encode()) for w in WORDS.findall(text))
    words = {tuple(w): n for w, n in counts.items()}
    merges: list[tuple[str, str]] = []
    while 256 + len(merges) < size:
        pairs: Counter = Counter()
        for w, n in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += n
        if not pairs:
            break
        best = max(pairs, key=pairs.__getitem__)  # the first counted of equals: deterministic
        merges.append(best)
        merged = {}
        for w, n in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + n
        words = merged
    return merges


def tokenizer(rng: random.Random) -> tuple[dict, dict[str, int]]:
    chars = byte_chars()
    merges = train_merges(corpus(rng), chars, MAX_VOCAB - len(SPECIAL))
    vocab = {c: i for i, c in enumerate(chars)}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    special = {s: len(vocab) + i for i, s in enumerate(SPECIAL)}
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": s,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for s, i in special.items()
        ],  # fmt: skip
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        "post_processor": {"type": "ByteLevel", **byte_level},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }
    return data, special


def bf16(values) -> bytes:
    """float values as bf16 (the upper half of each float32, little-endian)."""
    bits = array.array("I")
    bits.frombytes(array.array("f", values).tobytes())
    out = array.array("H", (b >> 16 for b in bits))
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def tensors(rng: random.Random, vocab: int, special: list[int]) -> dict[str, tuple[list[int], bytes]]:
    def normal(*shape, zero_rows=()):
        values = [rng.gauss(0.0, 0.02) for _ in range(shape[0] * shape[1])]
        for r in zero_rows:
            values[r * shape[1] : (r + 1) * shape[1]] = [0.0] * shape[1]
        return list(shape), bf16(values)

    def ones(n):
        return [n], bf16([1.0] * n)

    kv = KV_HEADS * HEAD_DIM
    out = {"model.embed_tokens.weight": normal(vocab, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ones(HIDDEN)
        out[p + "self_attn.q_proj.weight"] = normal(HEADS * HEAD_DIM, HIDDEN)
        out[p + "self_attn.k_proj.weight"] = normal(kv, HIDDEN)
        out[p + "self_attn.v_proj.weight"] = normal(kv, HIDDEN)
        out[p + "self_attn.o_proj.weight"] = normal(HIDDEN, HEADS * HEAD_DIM)
        out[p + "post_attention_layernorm.weight"] = ones(HIDDEN)
        out[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        out[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, HIDDEN)
        out[p + "mlp.down_proj.weight"] = normal(HIDDEN, INTERMEDIATE)
    out["model.norm.weight"] = ones(HIDDEN)
    out["lm_head.weight"] = normal(vocab, HIDDEN, zero_rows=special)
    return out


def safetensors(named: dict[str, tuple[list[int], bytes]]) -> bytes:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in sorted(named):
        shape, data = named[name]
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(named[n][1] for n in sorted(named))


def write(path: Path) -> Path:
    """The model's files under `path` (made again from the seed: the same bytes every time)."""
    rng = random.Random(SEED)
    tok, special = tokenizer(rng)
    vocab = len(tok["model"]["vocab"]) + len(special)
    named = tensors(rng, vocab, sorted(special.values()))
    params = sum(len(data) // 2 for _, data in named.values())
    path.mkdir(parents=True, exist_ok=True)
    eos, pad = special[EOS], special["<|endoftext|>"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": vocab,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": pad,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "bfloat16",
        "glm_flash_tiny_parameters": params,
    }
    shard = "model-00001-of-00001.safetensors"
    files = {
        "config.json": json.dumps(config, indent=2, sort_keys=True) + "\n",
        "generation_config.json": json.dumps({"bos_token_id": pad, "eos_token_id": eos, "pad_token_id": pad}) + "\n",
        "tokenizer.json": json.dumps(tok, ensure_ascii=False) + "\n",
        "tokenizer_config.json": json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS,
                "pad_token": "<|endoftext|>",
                "model_max_length": 32768,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n",
        "model.safetensors.index.json": json.dumps(
            {"metadata": {"total_size": params * 2}, "weight_map": {n: shard for n in sorted(named)}}, indent=2
        )
        + "\n",
    }
    for name, text in files.items():
        (path / name).write_text(text, encoding="utf-8")
    (path / shard).write_bytes(safetensors(named))
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_model.py DIR")
    print(write(Path(sys.argv[1])))
