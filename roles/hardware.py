"""Stop early when the GPUs the host reports are not the ones the profile was written for."""

from __future__ import annotations

from pyinfra import host

from control.profile import Problem, Profile, ProfileError, fail
from control.report import skipped
from roles.facts.system import Gpus


def mismatches(profile: Profile, gpus) -> list[Problem]:
    found = []
    if len(gpus) < profile.gpu_count:
        found.append(
            Problem(
                profile.host,
                "gpu_count",
                f"the profile expects {profile.gpu_count} GPUs, nvidia-smi shows {len(gpus)}",
                "fix the hardware or set gpu_count (and tp_size) to match",
            )
        )
    caps = sorted({g.compute_capability for g in gpus})
    if caps and caps != [profile.gpu_compute_capability]:
        found.append(
            Problem(
                profile.host,
                "gpu_compute_capability",
                f"the profile says {profile.gpu_compute_capability}, the GPUs report {', '.join(caps)}",
                "set gpu_compute_capability to what the GPUs report",
            )
        )
    return found


def apply(profile: Profile) -> None:
    gpus = host.get_fact(Gpus)
    if not gpus:
        skipped("GPU count and capability check", "nvidia-smi shows no GPU yet (no driver, or no GPU)")
        return
    problems = mismatches(profile, gpus)
    if problems:
        fail(ProfileError(problems))
