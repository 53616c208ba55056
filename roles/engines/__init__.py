"""Which engine serves which platform: the one place the deploy branches on `platform` for
the engine. Each engine module has apply(profile) -> roles.engines.common.EngineResult and
launch_spec(profile, numa_nodes)."""

from __future__ import annotations

from control.profile import Profile
from roles.engines.kt import engine as kt
from roles.engines.vllm import engine as vllm

BY_PLATFORM = {"l40s": kt, "gb10": vllm}


def for_profile(profile: Profile):
    return BY_PLATFORM[profile.platform]
