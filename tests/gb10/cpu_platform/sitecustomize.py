"""On PYTHONPATH for tests only: vLLM's CPU platform set before anything asks for it, because this
machine has no GPU for vLLM to detect (tests/gb10/test_check_flags_vllm.py). Nothing else changes."""

import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()
