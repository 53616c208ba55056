"""Stop this host, and only it, when its GPUs are not the ones the profile was written for.

Decided inside an operation from facts read when it runs: the NVIDIA devices on the PCI bus
(there before any driver is installed) and what nvidia-smi reports once a driver answers.
"""

from __future__ import annotations

from control.profile import Profile
from roles.operations.hardware import gpus_match


def apply(profile: Profile) -> None:
    gpus_match(
        name="GPUs are the profile's (count and compute capability)",
        gpu_count=profile.gpu_count,
        compute_capability=profile.gpu_compute_capability,
        require_gpu=profile.require_gpu,
    )
