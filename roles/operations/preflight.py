"""The preflight check (roles/preflight.py): what the box has, read when the operation runs, against
what the profile asks; a shortfall refuses this host only, with every shortfall in one message."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import FileContents

from control import layout
from control.profile import Profile
from pyinfra_ext import memo
from pyinfra_ext.refusal import refusal
from roles.facts.capacity import BoxCapacity, Capacity
from roles.operations.toolkit import RUNFILE_MARKER, toolkit_package

GIB = 1 << 30
ENVS_KEPT = 2  # an upgrade builds the new environment beside the serving one
# Where the CUDA runfile path writes (files/glm-flash-nvidia-repo: RUNFILE_CACHE, mkdtemp under
# /var/tmp for --tmpdir, --toolkitpath), in the order of the capacity fact's paths after the two above.
CUDA_RUNFILE_CACHE = layout.CUDA_RUNFILE_CACHE
CUDA_EXTRACT_DIR = "/var/tmp"


def cuda_paths(profile: Profile) -> tuple[str, str, str]:
    return (CUDA_RUNFILE_CACHE, CUDA_EXTRACT_DIR, f"/usr/local/cuda-{profile.cuda_version}")


def toolkit_pending(profile: Profile, installed: dict, marker: list | None) -> bool:
    """The deploy will install the CUDA toolkit: NVIDIA's repository path (the others ship it), and
    neither its package nor a finished runfile install (the marker holding this runfile's sha256)."""
    if profile.driver_source != "nvidia-repo":
        return False
    package = toolkit_package(profile.cuda_version)
    done = bool(installed.get(package)) or bool(marker and marker[0].strip() == profile.cuda_runfile_sha256)
    return not done


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def has_flag(flags, flag: str) -> bool:
    # The kernel spells some with and some without the underscore (avx512_vbmi is "avx512vbmi").
    return flag in flags or flag.replace("_", "") in flags


def disk_needs(profile: Profile, c: Capacity, paths: tuple, toolkit: bool = False) -> list[str]:
    """Bytes still to be written per filesystem against what is free there. With `toolkit` (not yet
    installed), paths[2:5] are cuda_paths(profile): the runfile (less what of it is already
    downloaded), its extraction and the toolkit, all there at once at the end of the install."""

    def part(at: int, size_gib: float, what: str, sized: int | None = None) -> tuple:
        """(index in paths, bytes still needed, what): size_gib less what of it is already in sized[sized]."""
        return (at, max(0, size_gib * GIB - c.used.get(sized, 0)), f"{what} ({size_gib:g} GiB)")

    envs, env_gib = max(0, ENVS_KEPT - c.complete_envs), profile.preflight_engine_env_gib
    parts = [
        (1, envs * env_gib * GIB, f"{envs} engine environment(s) of {env_gib:g} GiB"),
        part(1, profile.preflight_wheelhouse_gib, "the wheelhouse", 1),
    ]
    if profile.model_download:
        parts.append(part(0, profile.preflight_model_gib, "the model", 0))
    if toolkit:
        parts += [
            part(2, profile.preflight_cuda_runfile_gib, "the CUDA runfile", 2),
            part(3, profile.preflight_cuda_extract_gib, "its extraction"),
            part(4, profile.preflight_cuda_toolkit_gib, "the CUDA toolkit"),
        ]
    if profile.on_platform.fork_files:  # after the toolkit's, in paths and in sized (where() below)
        at, sz = (5, 3) if toolkit else (2, 2)
        if profile.moe_w2_store:
            parts.append(part(at, profile.preflight_moe_store_gib, "the expert store", sz))
        parts.append(part(at + 1, profile.preflight_drafter_gib, "the drafter", sz + 1))
    by_mount: dict[str, list] = {}
    for index, need, what in parts:
        disk = c.disks.get(index)
        if disk is None or not need:
            continue
        entry = by_mount.setdefault(disk.mount, [disk.free, 0, [], set()])
        entry[0] = min(entry[0], disk.free)
        entry[1] += need
        entry[2].append(f"{what}: {gib(need)} still to write")
        entry[3].add(paths[index])
    return [
        f"disk: {gib(free)} free on {mount}, {gib(need)} needed there ({'; '.join(whats)}; for "
        f"{', '.join(sorted(where))}). Fix: free space on {mount}, or move model_path/install_root "
        "to a larger filesystem (sizes: the preflight_*_gib knobs)"
        for mount, (free, need, whats, where) in sorted(by_mount.items())
        if free < need
    ]


def shortfalls(profile: Profile, c: Capacity, paths: tuple, toolkit: bool = False) -> list[str]:
    found = disk_needs(profile, c, paths, toolkit)
    if profile.on_platform.cpu_experts and profile.kt_cpuinfer > c.cores:
        found.append(
            f"kt_cpuinfer: {profile.kt_cpuinfer} CPU-expert threads, the box has {c.cores} physical cores "
            f"({c.cpus} logical CPUs). Fix: set kt_cpuinfer to at most {c.cores}, leaving a few for the OS"
        )
    missing = [f for f in profile.preflight_cpu_flags if not has_flag(c.flags, f)]
    if missing:
        found.append(
            f"CPU: the FP8 CPU experts need {', '.join(profile.preflight_cpu_flags)}; this CPU lacks "
            f"{', '.join(missing)} (/proc/cpuinfo). Fix: a CPU that has them (the field box: EPYC 9845), "
            "or preflight_cpu_flags: [] to run kt-kernel's slower variant knowingly"
        )
    if c.mem_total < profile.preflight_memory_gib * GIB:
        found.append(
            f"memory: {gib(c.mem_total)} installed, {profile.preflight_memory_gib:g} GiB needed "
            "(preflight_memory_gib: the experts and the KV pool). Fix: add memory"
        )
    return found


def where(profile: Profile, toolkit: bool = False) -> tuple[tuple, tuple]:
    """(paths whose filesystems take data, directories whose size counts against it), by index; with
    `toolkit` (still to be installed) the CUDA runfile's paths come third."""
    engine = layout.engine_root(profile)
    paths = (profile.model_path, profile.install_root) + (cuda_paths(profile) if toolkit else ())
    sized = (profile.model_path, f"{engine}/wheelhouse") + ((CUDA_RUNFILE_CACHE,) if toolkit else ())
    if profile.on_platform.fork_files:  # the fork's expert store and the drafter
        paths += (layout.moe_store_dir(profile), profile.drafter_path)
        sized += (layout.moe_store_dir(profile), profile.drafter_path)
    return paths, sized


@operation(is_idempotent=True)
def check(profile: Profile):
    """
    Refuse this host, before any change, when it cannot hold or run what the profile asks.

    + profile: the host's profile (its disk, memory and core needs, the toolkit it installs)
    """
    engine = layout.engine_root(profile)
    marker = f"/usr/local/cuda-{profile.cuda_version}/{RUNFILE_MARKER}"
    toolkit = profile.driver_source == "nvidia-repo" and toolkit_pending(
        profile, memo.fact(host, DebPackages), memo.fact(host, FileContents, path=marker)
    )
    paths, sized = where(profile, toolkit)
    c = memo.fact(host, BoxCapacity, paths=paths, sized=sized, envs=f"{engine}/envs")
    found = shortfalls(profile, c, paths, toolkit)
    if found:
        yield refusal(
            f"{host.name}: preflight: this host cannot take the deploy; nothing was changed on it.\n  - "
            + "\n  - ".join(found)
        )
        return
    host.noop(
        f"preflight: {c.cores} cores, {gib(c.mem_total)} memory, "
        + ", ".join(f"{gib(d.free)} free on {d.mount}" for d in {d.mount: d for d in c.disks.values()}.values())
    )
