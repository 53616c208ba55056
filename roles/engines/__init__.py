"""The engines' room: which engine serves which platform, the one place the deploy branches on
`platform` for the engine. One package per engine (kt/: KTransformers + SGLang-kt on the L40S
box; vllm/: the vLLM-Moet fork on the GB10 box, and vLLM's CPU build in the sandbox, vllm/cpu.py),
each behind the same contract, its engine.py (cpu.py):

- apply(profile, checkpoint_ready) -> common.EngineResult: the environment built beside the
  serving one, patched, its flags checked by its own parser, then `current` switched; the result
  carries its label, its environment and the launch facts the service runs;
- launch_spec(profile, numa_nodes) -> dict: the launch facts (python, module, flags);
- artifacts(profile) -> [common.Upload]: what it uploads from the control machine, so the fleet
  (roles/fleet/) can stage them on its workers before the single-host deploy runs.

Nothing outside this folder imports an engine's package: deploy.py and the fleet go through
for_profile(); what else differs per platform is the profile's (control/profile.py ON_PLATFORM).
"""

from __future__ import annotations

from control.profile import Profile
from roles.engines.kt import engine as kt
from roles.engines.vllm import cpu
from roles.engines.vllm import engine as vllm

BY_PLATFORM = {"l40s": kt, "gb10": vllm, "cpu": cpu}


def for_profile(profile: Profile):
    return BY_PLATFORM[profile.platform]
