"""locks/vllm/0.24.0-aarch64.txt: the GB10 engine's wheels, as `make vllm-lock` resolves them.

Read as pip reads a --require-hashes file: every pin exact and hashed. What it must hold is
docs/sources.md §20: the release the fork's patch is made for, its CUDA 13.0 torch, the
flashinfer the fork swaps in, without the flashinfer-cubin the fork removes."""

from __future__ import annotations

import re
from pathlib import Path

from control.defaults import KNOBS, PLATFORMS

REPO = Path(__file__).resolve().parents[2]
LOCK_DIR = REPO / "locks" / "vllm"


def lock(ext: str) -> Path:
    return LOCK_DIR / f"0.24.0-aarch64.{ext}"


PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+) \\$")


def pins() -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) for every pin of the lock."""
    out: dict[str, tuple[str, int]] = {}
    name = None
    for line in lock("txt").read_text().splitlines():
        m = PIN.match(line)
        if m:
            name = m.group(1).lower()
            assert name not in out, f"{name} pinned twice"
            out[name] = (m.group(2), 0)
        elif line.strip().startswith("--hash=sha256:") and name:
            assert re.fullmatch(r"--hash=sha256:[0-9a-f]{64}( \\)?", line.strip()), line
            out[name] = (out[name][0], out[name][1] + 1)
        elif line and not line.lstrip().startswith("#"):
            raise AssertionError(f"unexpected line in the lock: {line!r}")
    return out


def test_the_lock_holds_the_release_the_fork_patches():
    p = pins()
    assert p["vllm"][0] == KNOBS["vllm_version"].default == "0.24.0"
    assert p["torch"][0] == "2.11.0"
    assert p["flashinfer-python"][0] == "0.6.14"
    assert "flashinfer-cubin" not in p
    # torch 2.11.0 for aarch64 on PyPI is the CUDA 13.0 build: its CUDA 13 wheels come with it
    assert "nvidia-cudnn-cu13" in p and not [n for n in p if n.endswith("-cu12")]
    assert all(n for _, n in p.values()), [k for k, (_, n) in p.items() if not n]


def test_make_vllm_lock_makes_this_file_for_the_gb10_python():
    make = (REPO / "Makefile").read_text()
    rule = make[make.index("vllm-lock: venv") :].split("\n\n", 1)[0]
    assert "VLLM_LOCK = locks/vllm/0.24.0-aarch64" in make
    assert f"--python-version {PLATFORMS['gb10']['python_version']}" in rule
    assert "--python-platform aarch64-manylinux_2_39" in rule and "--only-binary :all:" in rule
    for part in ("$(VLLM_LOCK).in", "$(VLLM_LOCK).overrides", "$(VLLM_LOCK).excludes", "-o $(VLLM_LOCK).txt"):
        assert part in rule
    assert "flashinfer-python==0.6.14" in lock("overrides").read_text()
    assert "flashinfer-cubin" in lock("excludes").read_text()
