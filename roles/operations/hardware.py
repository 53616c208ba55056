"""The GPUs are the profile's (roles/hardware.py): decided when the operation runs, from the NVIDIA
devices on the PCI bus (there before any driver) and what nvidia-smi reports once a driver answers."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from control.problems import Problem
from control.report import skipped
from pyinfra_ext import memo
from pyinfra_ext.refusal import refusal_command
from roles.facts.driver import NvidiaPciDevices
from roles.facts.system import Gpus


def mismatches(name: str, gpu_count: int, capability: str, require_gpu: bool, gpus, pci_devices) -> list[Problem]:
    """What the host's GPUs contradict in the profile (nvidia-smi's view when it has one, else the PCI bus's)."""
    fix = "fix the hardware or set gpu_count (and tp_size) to match"
    found = []
    if gpus and len(gpus) < gpu_count:
        said = f"the profile expects {gpu_count} GPUs, nvidia-smi shows {len(gpus)}"
        found.append(Problem(name, "gpu_count", said, fix))
    elif not gpus and require_gpu and len(pci_devices) < gpu_count:
        said = f"the profile expects {gpu_count} NVIDIA GPUs, the PCI bus shows {len(pci_devices)}"
        found.append(Problem(name, "gpu_count", said, f"{fix}; require_gpu: false for a test box"))
    caps = sorted({g.compute_capability for g in gpus})
    if caps and caps != [capability]:
        said = f"the profile says {capability}, the GPUs report {', '.join(caps)}"
        found.append(
            Problem(name, "gpu_compute_capability", said, "set gpu_compute_capability to what the GPUs report")
        )
    return found


@operation(is_idempotent=True)
def gpus_match(gpu_count: int, compute_capability: str, require_gpu: bool):
    """
    The GPUs are the profile's; otherwise this host fails here, before anything is changed on it.

    + gpu_count: how many GPUs the profile expects
    + compute_capability: theirs, like 8.9
    + require_gpu: false: a host without GPUs (the sandbox, CI) passes and says it skipped the check
    """
    gpus = memo.fact(host, Gpus)
    pci = memo.fact(host, NvidiaPciDevices)
    problems = mismatches(host.name, gpu_count, compute_capability, require_gpu, gpus, pci)
    if problems:
        yield refusal_command(problems)
    elif gpus:
        host.noop(f"{len(gpus)} GPU(s) of compute capability {compute_capability}, as the profile says")
    else:
        skipped("GPU count and capability check", "nvidia-smi shows no GPU yet (no driver, or no GPU)")
