"""The preflight check (roles/preflight.py): what the box has, read when the operation runs, against
what the profile asks; a shortfall refuses this host only, with every shortfall in one message."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from control import layout
from control.profile import Profile
from roles.facts import memo
from roles.facts.capacity import BoxCapacity, Capacity
from roles.operations.refusal import refusal

GIB = 1 << 30
ENVS_KEPT = 2  # an upgrade builds the new environment beside the serving one


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def has_flag(flags, flag: str) -> bool:
    # The kernel spells some with and some without the underscore (avx512_vbmi is "avx512vbmi").
    return flag in flags or flag.replace("_", "") in flags


def disk_needs(profile: Profile, c: Capacity, paths: tuple) -> list[str]:
    """Bytes still to be written per filesystem against what is free there."""
    wheelhouse = profile.preflight_wheelhouse_gib * GIB
    parts = [
        # (index in paths, bytes still needed, what)
        (
            1,
            max(0, ENVS_KEPT - c.complete_envs) * profile.preflight_engine_env_gib * GIB,
            f"{max(0, ENVS_KEPT - c.complete_envs)} engine environment(s) of {profile.preflight_engine_env_gib:g} GiB",
        ),
        (1, max(0, wheelhouse - c.used.get(1, 0)), f"the wheelhouse ({profile.preflight_wheelhouse_gib:g} GiB)"),
    ]
    if profile.model_download:
        model = profile.preflight_model_gib * GIB
        parts.append((0, max(0, model - c.used.get(0, 0)), f"the model ({profile.preflight_model_gib:g} GiB)"))
    if profile.platform == "gb10":
        if profile.moe_w2_store:
            store = profile.preflight_moe_store_gib * GIB
            parts.append(
                (2, max(0, store - c.used.get(2, 0)), f"the expert store ({profile.preflight_moe_store_gib:g} GiB)")
            )
        drafter = profile.preflight_drafter_gib * GIB
        parts.append((3, max(0, drafter - c.used.get(3, 0)), f"the drafter ({profile.preflight_drafter_gib:g} GiB)"))
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


def shortfalls(profile: Profile, c: Capacity, paths: tuple) -> list[str]:
    found = disk_needs(profile, c, paths)
    if profile.platform == "l40s" and profile.kt_cpuinfer > c.cores:
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


def where(profile: Profile) -> tuple[tuple, tuple]:
    """(paths whose filesystems take data, directories whose size counts against it), by index."""
    engine = layout.engine_root(profile)
    paths = (profile.model_path, profile.install_root)
    sized = (profile.model_path, f"{engine}/wheelhouse")
    if profile.platform == "gb10":  # the fork's expert store and the drafter
        paths += (layout.moe_store_dir(profile), profile.drafter_path)
        sized += (layout.moe_store_dir(profile), profile.drafter_path)
    return paths, sized


@operation(is_idempotent=True)
def check(profile: Profile):
    """Refuse this host, before any change, when it cannot hold or run what the profile asks."""
    paths, sized = where(profile)
    engine = layout.engine_root(profile)
    c = memo.fact(host, BoxCapacity, paths=paths, sized=sized, envs=f"{engine}/envs")
    found = shortfalls(profile, c, paths)
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
