"""Tuned Triton kernel configs for the GPU, placed where sglang-kt reads them (docs/sources.md §5).

The field tuned 6 block-FP8 GEMM shapes and the fused MoE E=288,N=1024 for the L40S
(+6.6% hot prefill). Their contents were not published: a user drops their own tuned
JSON files into the directory the `triton_configs_dir` knob names (relative to the repo,
or absolute, on the control machine). Empty knob: nothing is installed (reported).

Where the engine looks:
- fused MoE, `E=...,N=...,device_name=...,dtype=...,block_shape=[128, 128].json`:
  `$SGLANG_MOE_CONFIG_DIR/configs/triton_<triton version>/` (default: inside the package).
  We keep them outside site-packages, in install_root/triton-configs/moe, and the service
  environment sets SGLANG_MOE_CONFIG_DIR to it (moe_env(), from apply()'s placements). Note
  that the engine then no longer looks at the configs the package ships for other shapes.
- block-FP8 GEMM, `N=...,K=...,device_name=...,dtype=fp8_w8a8,block_shape=[128, 128].json`:
  only the package's fixed `sglang/srt/layers/quantization/configs/` (no variable), so
  these go into each engine environment's site-packages (new environments get them before
  `current` moves).
The file names carry a space (`block_shape=[128, 128]`): paths are quoted everywhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from control import layout
from control.profile import Profile
from control.report import skipped
from roles.operations import paths

REPO = layout.REPO
MOE_NAME = re.compile(
    r"^E=\d+,N=\d+,device_name=[^,/]+(,dtype=[^,/]+)?(,block_shape=\[\d+, \d+\])?"
    r"(,per_channel_quant=True)?(_down)?\.json$"
)
GEMM_NAME = re.compile(r"^N=\d+,K=\d+,device_name=[^,/]+,dtype=fp8_w8a8,block_shape=\[\d+, \d+\]\.json$")
GEMM_DIR = "sglang/srt/layers/quantization/configs"


class TritonConfigError(Exception):
    pass


@dataclass(frozen=True)
class Placement:
    src: Path  # on the control machine
    dest: str  # on the host
    kind: str  # "moe" or "gemm"


def source_dir(profile: Profile) -> Path | None:
    if not profile.triton_configs_dir:
        return None
    p = Path(profile.triton_configs_dir)
    return p if p.is_absolute() else REPO / p


def moe_dir(profile: Profile) -> str:
    return layout.triton_moe_dir(profile)


def _check(path: Path) -> None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise TritonConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not data:
        raise TritonConfigError(f"{path}: expected an object of batch size -> kernel config")
    for key, value in data.items():
        if not key.isdigit() or not isinstance(value, dict):
            raise TritonConfigError(
                f"{path}: key {key!r} must be a batch size with a config object (the engine reads int(key))"
            )


def placements(profile: Profile, site_packages: str, triton: str | None) -> list[Placement]:
    """Where each tuned file goes; TritonConfigError for a file the engine would never read.
    triton: the version the engine lock installs (the engine keys MoE configs by it)."""
    src = source_dir(profile)
    if src is None:
        return []
    if not src.is_dir():
        raise TritonConfigError(f"{src} is not a directory")
    out = []
    for f in sorted(src.iterdir()):
        if f.name.startswith(".") or f.is_dir() or f.suffix != ".json":
            continue
        _check(f)
        if MOE_NAME.match(f.name):
            if not triton:
                raise TritonConfigError(f"{f.name} is a MoE config, but the engine lock pins no triton")
            triton_dir = "triton_" + triton.replace(".", "_")
            out.append(Placement(f, f"{moe_dir(profile)}/configs/{triton_dir}/{f.name}", "moe"))
        elif GEMM_NAME.match(f.name):
            out.append(Placement(f, f"{site_packages}/{GEMM_DIR}/{f.name}", "gemm"))
        else:
            raise TritonConfigError(
                f"{f}: not a name the engine reads. Expected "
                "'E=288,N=1024,device_name=NVIDIA_L40S,dtype=fp8_w8a8,block_shape=[128, 128].json' "
                "(MoE) or 'N=..,K=..,device_name=NVIDIA_L40S,dtype=fp8_w8a8,block_shape=[128, 128].json' "
                "(block-FP8 GEMM), with the space after the comma"
            )
    if not out:
        raise TritonConfigError(f"{src} holds no tuned config (*.json)")
    return out


def moe_env(profile: Profile, places: Sequence[Placement]) -> dict[str, str]:
    """Service environment: SGLANG_MOE_CONFIG_DIR when tuned MoE configs are installed (apply()'s placements)."""
    return {"SGLANG_MOE_CONFIG_DIR": moe_dir(profile)} if any(p.kind == "moe" for p in places) else {}


def apply(profile: Profile, site_packages: str, triton: str | None) -> list[Placement]:
    """Install the tuned configs for the environment at `site_packages` and return where they went;
    TritonConfigError for a file the engine would never read (the caller refuses the host)."""
    places = placements(profile, site_packages, triton)
    if not places:
        skipped(
            "tuned Triton configs",
            "triton_configs_dir is empty (the field's tuned files were not published; "
            "drop your own into a directory and name it there); the engine uses its default kernel configs",
        )
        return places
    for d in sorted({str(Path(p.dest).parent) for p in places}):
        paths.directory(d, mode="755", user="root", group="root", name=f"Directory {d}")
    for p in places:
        paths.put(
            str(p.src), p.dest, mode="644", user="root", group="root", name=f"Tuned Triton {p.kind} config {p.src.name}"
        )
    return places
