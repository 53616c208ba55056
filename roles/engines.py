"""Which engine serves which platform: the one place the deploy branches on `platform` for
the engine. Each engine module has apply(profile) -> roles.engine.EngineResult and
launch_spec(profile, numa_nodes)."""

from __future__ import annotations

from control.profile import Profile
from roles import engine_kt, engine_vllm

BY_PLATFORM = {"l40s": engine_kt, "gb10": engine_vllm}


def for_profile(profile: Profile):
    return BY_PLATFORM[profile.platform]
