"""Which engine serves which platform, the one place the deploy branches on `platform` for the
engine, and the contract each engine keeps. One package per engine (kt/: KTransformers +
SGLang-kt on the L40S box; vllm/: the vLLM-Moet fork on the GB10 box, and vLLM's CPU build in the
sandbox, vllm/cpu.py), its engine.py (cpu.py):

- apply(profile, checkpoint_ready) -> common.EngineResult: the environment built beside the
  serving one, patched, its flags checked by its own parser, then `current` switched; the result
  carries its environment and the launch facts the service runs;
- artifacts(profile) -> [common.Upload]: what it uploads from the control machine, so the fleet
  (roles/fleet/) can stage them on its workers before the single-host deploy runs.

Nothing outside roles/engines/ imports an engine's package: deploy.py and the fleet go through
for_profile(); what else differs per platform is the profile's (control/profile.py ON_PLATFORM).
A module of its own, not the package's __init__: each engine imports roles.engines.common, which
runs the package first, so a dispatch there made an import circle.
"""

from __future__ import annotations

from control.profile import Profile
from roles.engines.kt import engine as kt
from roles.engines.vllm import cpu
from roles.engines.vllm import engine as vllm

BY_PLATFORM = {"l40s": kt, "gb10": vllm, "cpu": cpu}


def for_profile(profile: Profile):
    return BY_PLATFORM[profile.platform]
