"""Fact parsers on real command output: captured on this machine and in the Debian 13
sandbox; nvidia-smi output in its documented formats (no GPU here)."""

import subprocess
from pathlib import Path

from roles.facts.apt import LEGACY_SOURCES, LegacyAptSources
from roles.facts.system import CudaToolkits, GpuProcesses, Gpus, NumaNodes, UnitFiles

DATA = Path(__file__).parent / "data"


def lines(name):
    return (DATA / name).read_text().splitlines()


def test_gpus_from_nvidia_smi_csv():
    gpus = Gpus.parse(lines("nvidia-smi-query-gpu-l40s.csv"))
    assert [(g.index, g.name, g.compute_capability, g.memory_mib) for g in gpus] == [
        (0, "NVIDIA L40S", "8.9", 46068),
        (1, "NVIDIA L40S", "8.9", 46068),
    ]
    assert gpus[0].driver_version == "580.95.05"


def test_no_gpu_is_an_empty_list():
    assert Gpus.parse([]) == []
    assert Gpus.parse(["NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."]) == []


def test_gpu_processes_include_graphics_ones():
    procs = GpuProcesses.parse(lines("nvidia-smi-q-pids-desktop.txt"))
    assert [(p.pid, p.kind, p.used_mib) for p in procs] == [(2871, "G", 412), (3120, "C+G", 221), (4411, "C", 25000)]
    assert [p.name for p in procs if p.is_desktop] == ["/usr/lib/xorg/Xorg", "/usr/bin/gnome-shell"]
    assert {p.bus_id for p in procs} == {"00000000:41:00.0"}


def test_numa_nodes():
    assert NumaNodes.parse(lines("numa-host.txt")) == 1
    assert NumaNodes.parse(["/sys/devices/system/node/node0", "/sys/devices/system/node/node1"]) == 2
    assert NumaNodes.parse([]) == 1


def test_cuda_toolkits():
    assert CudaToolkits.parse(["/usr/local/cuda-12.8", "/usr/local/cuda-13.0/"]) == {
        "12.8": "/usr/local/cuda-12.8",
        "13.0": "/usr/local/cuda-13.0",
    }
    assert CudaToolkits.parse(["/usr/local/cuda-[0-9]*"]) == {}


def test_unit_files_from_trixie():
    units = UnitFiles.parse(lines("unit-files-trixie.txt"))
    assert units["ssh.service"] == "enabled"
    assert units["sshd.service"] == "alias" and "multi-user.target" in units
    assert "gdm3.service" not in units


def test_legacy_sources_keeps_only_active_lines(tmp_path):
    """The fact's own command (grep) on a sources.list of comments, blanks and one active line."""
    legacy = tmp_path / "sources.list"
    legacy.write_text("# deb http://old trixie main\n\n   \ndeb http://deb.debian.org/debian trixie main\n")
    command = LegacyAptSources().command().replace(LEGACY_SOURCES, str(legacy))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
    assert LegacyAptSources.parse(out.splitlines()) == ["deb http://deb.debian.org/debian trixie main"]
    missing = command.replace(str(legacy), str(tmp_path / "none"))
    assert subprocess.run(["sh", "-c", missing], capture_output=True, text=True, check=True).stdout == ""
