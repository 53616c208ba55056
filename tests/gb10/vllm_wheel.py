"""The real vLLM 0.24.0 wheel from PyPI (the release the vLLM-Moet fork's patch is made for,
docs/sources.md §20), cached, and what the GB10 tests build from it.

- `parser_python()`: a cached venv in which vLLM's own serve argument parser and app can be
  built. vLLM 0.24.0 pins torch 2.11.0 (CUDA, several GB); the parser only needs `import torch`
  to work, so the venv takes the CPU build of torch 2.13.0 that this machine kind keeps
  on disk (/opt/wheels; elsewhere torch==2.13.0 from PyPI) and vLLM with --no-deps plus the
  pure-Python packages its import chain needs (parser-requirements.txt), installed by the
  pinned uv (locks/tools.txt).
  The probes set vLLM's CPU platform: this machine has no GPU to detect.
- `release_python(dest)`: the release's Python files as a stand-in site-packages.

The x86_64 wheel carries the same Python files as the aarch64 one the GB10 box installs; the
fork's patch is pure Python, so what these tests parse is what the box runs before the patch.

Everything lands under ${GLM_FLASH_CACHE:-~/.cache/glm-flash}; a second run fetches nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))
import pypi  # noqa: E402  (tests/engine/pypi.py: verified, cached PyPI wheels)

from control.engine_lock import tools_bin  # noqa: E402

# The release the vLLM-Moet fork's patch is made for (docs/sources.md §20).
VLLM_VERSION = "0.24.0"
SCHEDULER = "vllm/v1/core/sched/scheduler.py"
# The CPU torch this machine kind ships on disk (its pip configuration finds it).
PARSER_TORCH = "torch==2.13.0"
# The pure-Python closure the parser imports, frozen from a working venv (installed --no-deps).
PARSER_LOCK = Path(__file__).resolve().parent / "parser-requirements.txt"


def wheel() -> Path:
    return pypi.wheel("vllm", VLLM_VERSION)


def parser_venv() -> Path:
    return pypi.cache_dir() / f"vllm-{VLLM_VERSION}-parser-venv"


def parser_python() -> Path:
    """Interpreter of the parser venv, built once (marker written last)."""
    venv = parser_venv()
    marker = venv / ".glm-flash-complete"
    want = f"{VLLM_VERSION}\n{PARSER_TORCH}\n" + PARSER_LOCK.read_text()
    if marker.exists() and marker.read_text() == want:
        return venv / "bin" / "python"
    shutil.rmtree(venv, ignore_errors=True)
    # The pinned uv (locks/tools.txt), as the hosts' environments are built: a sixth of pip's CPU
    # time here. Bytecode compiled up front, as pip did: the probes run with PYTHONDONTWRITEBYTECODE
    # where it is set, and would compile vLLM's import chain again in every one.
    uv = str(tools_bin() / "uv")
    env = dict(os.environ, UV_NO_CONFIG="1")
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env)
    py = venv / "bin" / "python"
    install = [uv, "pip", "install", "--quiet", "--python", str(py), "--no-deps", "--compile-bytecode"]
    # This machine kind keeps a CPU torch on disk; PyPI has only CUDA builds of 2.13.0.
    local = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-cp311-*.whl"))
    subprocess.run(install + [str(local[0]) if local else PARSER_TORCH], check=True, env=env)
    subprocess.run(install + [str(wheel())], check=True, env=env)
    subprocess.run(install + ["-r", str(PARSER_LOCK)], check=True, env=env)
    marker.write_text(want)
    return py


def release_python(dest: Path, version: str = VLLM_VERSION) -> Path:
    """Every .py file of vllm/ in the real `version` wheel, under dest (a stand-in site-packages).

    The compiled parts (hundreds of MB) are left out: the fork's patch is pure Python."""
    with zipfile.ZipFile(pypi.wheel("vllm", version)) as z:
        for m in z.namelist():
            if m.startswith("vllm/") and m.endswith(".py"):
                out = dest / m
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(m))
    return dest
