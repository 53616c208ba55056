"""Tuned Triton configs land where the real sglang-kt code looks for them.

The file names and directories the engine computes are taken from the real wheels'
source (fused_moe_triton_config.get_config_file_name, run with the device name an L40S
reports, since there is no GPU here; fp8_kernel's block-FP8 file-name f-string) and
compared with roles/engines/kt/triton_configs.placements. The tuned contents from the field are not
published: the files here are small valid configs made up for the test.
"""

from __future__ import annotations

import ast
import json
import re
import sys
import zipfile
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import pypi  # noqa: E402

from control import profile  # noqa: E402
from control.engine_lock import load_lock, pin_of  # noqa: E402
from roles.engines.kt import triton_configs  # noqa: E402

MOE = "E=288,N=1024,device_name=NVIDIA_L40S,dtype=fp8_w8a8,block_shape=[128, 128].json"
GEMM = "N=4096,K=7168,device_name=NVIDIA_L40S,dtype=fp8_w8a8,block_shape=[128, 128].json"
CONF = {
    "1": {
        "BLOCK_SIZE_M": 16,
        "BLOCK_SIZE_N": 64,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": 1,
        "num_warps": 4,
        "num_stages": 3,
    }
}


def engine_names(version):
    """(moe file name, gemm file name, moe source, gemm source) as the real engine computes them."""
    with zipfile.ZipFile(pypi.wheel("sglang-kt", version)) as z:
        moe_src = z.read("sglang/srt/layers/moe/fused_moe_triton/fused_moe_triton_config.py").decode()
        gemm_src = z.read("sglang/srt/layers/quantization/fp8_kernel.py").decode()
    fn = next(n for n in ast.parse(moe_src).body if isinstance(n, ast.FunctionDef) and n.name == "get_config_file_name")
    ns = {"Optional": __import__("typing").Optional, "get_device_name": lambda: "NVIDIA L40S"}
    exec(compile(ast.Module([fn], []), "get_config_file_name", "exec"), ns)
    moe = ns["get_config_file_name"](288, 1024, "fp8_w8a8", [128, 128])
    m = re.search(r'json_file_name = (f"N=\{N\},K=\{K\},device_name=.*\.json")', gemm_src)
    gemm = eval(
        m.group(1),
        {},
        {"N": 4096, "K": 7168, "device_name": "NVIDIA L40S".replace(" ", "_"), "block_n": 128, "block_k": 128},
    )
    return moe, gemm, moe_src, gemm_src


@pytest.mark.parametrize("version", ["0.7.0.post1", "0.7.0.post4", "0.7.2"])
def test_placement_matches_the_engine(tmp_path, version):
    moe, gemm, moe_src, gemm_src = engine_names(version)
    assert (moe, gemm) == (MOE, GEMM)  # note the space in block_shape=[128, 128]
    assert 'os.environ.get(\n        "SGLANG_MOE_CONFIG_DIR"' in moe_src
    assert re.search(r'os\.path\.join\(\s*config_dir,\s*"configs",\s*version_dir,\s*json_file_name,?\s*\)', moe_src)
    assert re.search(r'os\.path\.dirname\(os\.path\.realpath\(__file__\)\), "configs", json_file_name', gemm_src)

    src = tmp_path / "tuned"
    src.mkdir()
    for name in (MOE, GEMM):
        (src / name).write_text(json.dumps(CONF))
    prof = profile.build("t", {"triton_configs_dir": str(src), "engine_set": version})
    site = "/opt/glm-flash/engine/envs/x/lib/python3.11/site-packages"
    triton = pin_of(load_lock(version)[1], "triton").version  # what the deploy passes
    places = {p.src.name: p for p in triton_configs.placements(prof, site, triton)}
    assert places[MOE].dest == f"/opt/glm-flash/triton-configs/moe/configs/triton_3_5_1/{MOE}"
    assert places[GEMM].dest == f"{site}/sglang/srt/layers/quantization/configs/{GEMM}"
    assert not places[MOE].dest.startswith(site)  # MoE configs stay outside site-packages
    assert triton_configs.moe_env(prof, list(places.values())) == {
        "SGLANG_MOE_CONFIG_DIR": "/opt/glm-flash/triton-configs/moe"
    }


def test_empty_knob_installs_nothing_and_bad_files_are_refused(tmp_path):
    assert triton_configs.placements(profile.build("t", {}), "/site", "3.5.1") == []
    assert triton_configs.moe_env(profile.build("t", {}), []) == {}
    src = tmp_path / "tuned"
    src.mkdir()
    prof = profile.build("t", {"triton_configs_dir": str(src)})
    with pytest.raises(triton_configs.TritonConfigError, match="holds no tuned config"):
        triton_configs.placements(prof, "/site", "3.5.1")
    (src / MOE.replace("[128, 128]", "[128,128]")).write_text(json.dumps(CONF))
    with pytest.raises(triton_configs.TritonConfigError, match="with the space after the comma"):
        triton_configs.placements(prof, "/site", "3.5.1")
    for f in src.iterdir():
        f.unlink()
    (src / GEMM).write_text('{"1": 5}')
    with pytest.raises(triton_configs.TritonConfigError, match="must be a batch size with a config object"):
        triton_configs.placements(prof, "/site", "3.5.1")
    (src / GEMM).write_text(json.dumps(CONF))
    gemm_only = triton_configs.placements(prof, "/site", "3.5.1")
    assert [p.kind for p in gemm_only] == ["gemm"]
    assert triton_configs.moe_env(prof, gemm_only) == {}
