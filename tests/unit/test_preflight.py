"""Preflight: the capacity fact's command run on this machine, and the decisions on real profiles.

The command is the one the deploy sends, run here with sh against real directories (one with a
space and a quote in its name); the decisions use the field boxes' figures (docs/sources.md §1).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from control.profile import build
from roles.facts.capacity import BoxCapacity, Capacity, Disk
from roles.operations.preflight import GIB, shortfalls, toolkit_pending

# EPYC 9845 (Zen 5): the kernel spells avx512_vbmi without its underscore.
EPYC_FLAGS = frozenset("fpu sse avx2 avx512f avx512dq avx512bw avx512vl avx512_vnni avx512vbmi avx512_bf16".split())
PATHS = ("/srv/models/GLM-5.3-Flash", "/opt/glm-flash")
REF = "a" * 40


def field_box(free_gib: float = 400, cores: int = 160, flags=EPYC_FLAGS, mem_gib: float = 768, **kw) -> Capacity:
    disk = Disk("/", int(free_gib * GIB))
    return Capacity(
        cpus=2 * cores, cores=cores, flags=flags, mem_total=int(mem_gib * GIB), disks={0: disk, 1: disk}, **kw
    )


def run_fact(paths, sized, envs) -> Capacity:
    cmd = BoxCapacity().command(paths=paths, sized=sized, envs=envs).get_raw_value()
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, check=True).stdout
    return BoxCapacity().process(out.splitlines())


def test_fact_reads_this_machine(tmp_path):
    odd = tmp_path / "it's a dir"
    (odd / "models").mkdir(parents=True)
    (odd / "models" / "shard").write_bytes(b"x" * (1 << 20))
    envs = tmp_path / "envs"
    for env, complete in (("a", True), ("b", False), ("c", True)):
        (envs / env).mkdir(parents=True)
        if complete:
            (envs / env / ".glm-flash-complete").touch()
    c = run_fact((str(odd / "not" / "yet"), str(odd)), (str(odd / "models"), str(tmp_path / "absent")), str(envs))
    assert c.cpus == os.cpu_count()
    assert 1 <= c.cores <= c.cpus
    with open("/proc/cpuinfo") as f:
        line = next(ln for ln in f if ln.startswith(("flags", "Features")))
    assert c.flags == frozenset(line.partition(":")[2].split())
    with open("/proc/meminfo") as f:
        assert c.mem_total == int(f.readline().split()[1]) * 1024
    free = shutil.disk_usage(tmp_path).free
    assert set(c.disks) == {0, 1} and abs(c.disks[0].free - free) < 256 << 20  # the nearest existing parent's
    assert c.used.keys() == {0} and (1 << 20) <= c.used[0] < (1 << 20) + (64 << 10)
    assert c.complete_envs == 2


def test_the_field_box_passes_and_a_converged_one_needs_only_the_upgrade_room():
    p = build("gpu1", {})
    assert shortfalls(p, field_box(), PATHS) == []
    # Model in place, one environment built, wheelhouse uploaded: only the second environment's room.
    done = {0: 306 * GIB, 1: 6 * GIB}
    assert shortfalls(p, field_box(free_gib=12, used=done, complete_envs=1), PATHS) == []
    [msg] = shortfalls(p, field_box(free_gib=5, used=done, complete_envs=1), PATHS)
    assert msg.startswith("disk: 5.0 GiB free on /, 11.0 GiB needed there") and "1 engine environment(s)" in msg


def test_disk_shortfall_names_free_and_needed_per_filesystem():
    p = build("gpu1", {})
    # The model on its own filesystem (100 GiB free, 306 needed); / has room for envs and wheels.
    c = field_box(free_gib=100)
    c.disks[0] = Disk("/srv", 100 * GIB)
    [msg] = shortfalls(p, c, PATHS)
    assert msg.startswith("disk: 100.0 GiB free on /srv, 306.0 GiB needed there (the model (306 GiB)")
    assert "for /srv/models/GLM-5.3-Flash)" in msg and "Fix: free space on /srv" in msg
    # All on one filesystem: the needs add up (306 + 2 x 11 + 6 = 334 GiB).
    [msg] = shortfalls(p, field_box(free_gib=330), PATHS)
    assert msg.startswith("disk: 330.0 GiB free on /, 334.0 GiB needed there")
    assert "for /opt/glm-flash, /srv/models/GLM-5.3-Flash)" in msg
    # A staged model (model_download false) is not counted.
    assert shortfalls(build("gpu1", {"model_download": False}), c, PATHS) == []


def test_cores_cpu_features_and_memory():
    p = build("gpu1", {})
    no_bf16 = EPYC_FLAGS - {"avx512_bf16"}
    found = shortfalls(p, field_box(cores=64, flags=no_bf16, mem_gib=256), PATHS)
    assert len(found) == 3
    assert found[0].startswith("kt_cpuinfer: 152 CPU-expert threads, the box has 64 physical cores (128 logical CPUs)")
    assert "this CPU lacks avx512_bf16 (/proc/cpuinfo)" in found[1]
    assert found[2].startswith("memory: 256.0 GiB installed, 330 GiB needed")
    # KTransformers' GLM-5.3-Flash recipe: at least 350 GB (326 GiB) available; 325 GiB in all is too little
    [msg] = shortfalls(build("gpu1", {"kt_cpuinfer": 64}), field_box(cores=64, mem_gib=325), PATHS)
    assert msg.startswith("memory: 325.0 GiB installed, 330 GiB needed")
    assert shortfalls(build("gpu1", {"kt_cpuinfer": 64}), field_box(cores=64), PATHS) == []


def test_gb10_checks_memory_only_against_its_unified_memory():
    p = build("gx10", {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True})
    arm = frozenset("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics".split())
    assert shortfalls(p, field_box(cores=20, flags=arm, mem_gib=121.6), PATHS) == []
    [msg] = shortfalls(p, field_box(cores=20, flags=arm, mem_gib=64), PATHS)
    assert msg.startswith("memory: 64.0 GiB installed, 107 GiB needed")


def test_gb10_counts_the_fp8_checkpoint_the_expert_store_and_the_drafter():
    """The fork builds its planes from the 306 GiB FP8 checkpoint and keeps an FP4 store on disk."""
    from roles.operations.preflight import where

    p = build("gx10", {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True})
    paths, sized = where(p)
    assert paths[2:] == sized[2:] == ("/var/lib/glm-flash/moe-w2-store", "/srv/models/GLM-5.3-Flash-DFlash2")
    arm = frozenset("fp asimd".split())

    def box(free_gib):  # one NVMe for everything, as on the GX10
        disk = Disk("/", int(free_gib * GIB))
        return Capacity(cpus=20, cores=20, flags=arm, mem_total=int(121.6 * GIB), disks=dict.fromkeys(range(4), disk))

    assert shortfalls(p, box(467), paths) == []  # 306 + 2 x 11 + 136 + 2.5 = 466.5 GiB
    [msg] = shortfalls(p, box(400), paths)
    assert msg.startswith("disk: 400.0 GiB free on /, 466.5 GiB needed there")
    assert "the model (306 GiB)" in msg and "the expert store (136 GiB)" in msg and "the drafter (2.5 GiB)" in msg
    no_store = build(
        "gx10", {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True, "moe_w2_store": False}
    )
    assert shortfalls(no_store, box(331), paths) == []


def test_aarch64_cpuinfo_counts_every_cpu_as_a_core():
    lines = ["cpus 20", "cores 0", "Features\t: fp asimd sve2", "MemTotal:       127535444 kB", "envs 0"]
    c = BoxCapacity.parse(lines)
    assert (c.cpus, c.cores, c.mem_total) == (20, 20, 127535444 * 1024) and "sve2" in c.flags


CUDA = ("/var/cache/glm-flash/cuda", "/var/tmp", "/usr/local/cuda-12.8")


def five_paths(free_gib: float, **kw) -> Capacity:
    c = field_box(free_gib=free_gib, **kw)
    for i in (2, 3, 4):
        c.disks[i] = c.disks[0]
    return c


def test_the_cuda_toolkit_counts_where_it_is_not_installed_yet():
    """Runfile 5.1 + extraction 7.5 + toolkit 7 GiB on top of model, envs and wheels, all on /:
    306 + 22 + 6 + 19.6 = 353.6 GiB; a converged box (toolkit in) does not count them."""
    p = build("gpu1", {})
    assert shortfalls(p, five_paths(360), PATHS + CUDA, toolkit=True) == []
    [msg] = shortfalls(p, five_paths(350), PATHS + CUDA, toolkit=True)
    assert msg.startswith("disk: 350.0 GiB free on /, 353.6 GiB needed there")
    for part in (
        "the CUDA runfile (5.1 GiB): 5.1 GiB still to write",
        "its extraction (7.5 GiB): 7.5 GiB still to write",
        "the CUDA toolkit (7 GiB): 7.0 GiB still to write",
    ):
        assert part in msg
    assert "/usr/local/cuda-12.8, /var/cache/glm-flash/cuda, /var/tmp" in msg
    assert shortfalls(p, five_paths(350), PATHS + CUDA, toolkit=False) == []


def test_a_small_root_filesystem_is_refused_for_the_toolkit_alone():
    """The model and the engine on their own big filesystems, / with 15 GiB: the toolkit's 19.6 GiB
    do not fit there (what used to fail midway through the runfile)."""
    p = build("gpu1", {})
    c = five_paths(15)
    c.disks[0] = c.disks[1] = Disk("/srv", 1000 * GIB)
    [msg] = shortfalls(p, c, PATHS + CUDA, toolkit=True)
    assert msg.startswith("disk: 15.0 GiB free on /, 19.6 GiB needed there") and "Fix: free space on /" in msg
    # half the runfile already downloaded by an earlier run: only the rest counts
    c.used[2] = int(2.6 * GIB)
    [msg] = shortfalls(p, c, PATHS + CUDA, toolkit=True)
    assert msg.startswith("disk: 15.0 GiB free on /, 17.0 GiB needed there (the CUDA runfile (5.1 GiB): 2.5 GiB still")


def test_toolkit_pending_reads_the_package_and_the_runfile_marker():
    p = build("gpu1", {})
    sha = p.cuda_runfile_sha256
    assert toolkit_pending(p, {}, None)
    assert toolkit_pending(p, {}, ["0" * 64])  # another runfile's install: this one runs again
    assert not toolkit_pending(p, {}, [sha])
    assert not toolkit_pending(p, {"cuda-toolkit-12-8": ["12.8.1-1"]}, None)
    gb10 = build("gx10", {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True})
    assert not toolkit_pending(gb10, {}, None)  # DGX OS ships it


def test_the_refusal_names_the_toolkit_before_any_change():
    """The operation on a fresh box with a small /: it reads the package list and the marker, asks the
    capacity fact for the toolkit's paths too, and refuses with the toolkit's figures."""
    from pyinfra.facts.deb import DebPackages
    from pyinfra.facts.files import FileContents

    from roles.operations import preflight as ops
    from tests.unit.fakehost import F, FakeHost, on

    p = build("gpu1", {})
    c = five_paths(15)
    c.disks[0] = c.disks[1] = Disk("/srv", 1000 * GIB)
    fake = FakeHost(
        {
            DebPackages: {},
            F(FileContents, path="/usr/local/cuda-12.8/.glm-flash-runfile"): None,
            F(
                BoxCapacity,
                paths=(p.model_path, p.install_root, *CUDA),
                sized=(p.model_path, f"{p.install_root}/engine/wheelhouse", CUDA[0]),
                envs=f"{p.install_root}/engine/envs",
            ): c,
        }
    )
    with on(fake):
        [cmd] = list(ops.check._inner(profile=p))
    reasons = cmd.args[0]
    assert "preflight: this host cannot take the deploy; nothing was changed on it" in reasons
    assert "15.0 GiB free on /, 19.6 GiB needed there" in reasons and "the CUDA toolkit (7 GiB)" in reasons


def test_the_runfile_cache_is_where_the_host_tool_puts_it():
    from pathlib import Path

    import glm_flash_host
    from roles.operations.preflight import CUDA_RUNFILE_CACHE

    tool = (Path(__file__).resolve().parents[2] / "files/glm-flash-nvidia-repo").read_text()
    assert "RUNFILE_CACHE = host.CUDA_RUNFILE_CACHE" in tool and glm_flash_host.CUDA_RUNFILE_CACHE == CUDA_RUNFILE_CACHE
    assert 'mkdtemp(prefix="glm-flash-cuda-", dir="/var/tmp")' in tool
