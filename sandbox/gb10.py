#!/usr/bin/env python3
"""The GB10 sandbox: a second Debian 13 machine (systemd-nspawn, real systemd) made to look like a
GB10 box (ASUS Ascent GX10 / DGX Spark, DGX OS) to the facts the deploy reads.

    sandbox/gb10.py up                        build if needed, boot, serve the fork and the hub
    sandbox/gb10.py prepare                   build the machine's files only (no boot)
    sandbox/gb10.py gpu gb10|none             what nvidia-smi's query answers (default none)
    sandbox/gb10.py down | destroy | status

What is simulated, at the edges only (the roles run unchanged; inventory/gb10_sandbox.py):
- DGX OS's release files: /etc/os-release with Ubuntu 24.04's fields, /etc/dgx-release (DGX OS
  7.2.3). The machine is Debian 13 underneath: apt installs Debian's packages (earlyoom among
  them) from Debian's mirror; Ubuntu's are not reachable here.
- `uname -m` says aarch64 (/usr/local/bin/uname answers -m; everything else is the real uname):
  the deploy's `server.Arch` fact. The machine is x86_64.
- `nvidia-smi`: with `gb10` in /srv/glm-flash-standin/nvidia-smi-mode (`sandbox/gb10.py gpu gb10`),
  its query answers GB10's line (NVIDIA GB10, compute capability 12.1, memory.total [N/A], driver
  580.95.05): the deploy recognises the GPU and expects to serve, and the service's start fails for
  the missing device. With `none` (the default) it answers as without a device, so the deploy
  skips the GPU steps and converges. `nvidia-smi -L` never lists a GPU. No NVIDIA device is on the PCI bus and no /dev/nvidia*: the driver check is skipped
  for a missing GPU (require_gpu false) and the service's GPU preflight refuses to start it.
- /proc/meminfo: the GX10's (128 GB, MemTotal 121.6 GiB; bind-mounted over the kernel's at boot by a unit), so the
  box's memory figure is the GB10's; MemAvailable in it is fixed, so earlyoom never acts here.
- /usr/local/cuda-13.0: DGX OS's toolkit directory (empty: nothing compiles here).
- python3.12: DGX OS's interpreter is a real CPython 3.12 copied from this machine
  (GLM_FLASH_PYTHON312_SOURCE, default pyenv's 3.12.1) into /usr as DGX OS has it (Debian 13 has
  none; its python3 is 3.13, which apt brings with the base packages and which runs our host
  tools here, where DGX OS's python3 is 3.12), with the stand-in sitecustomize of
  sandbox/gb10_python.py (uv's query answered as aarch64, so the lock installs PyPI's real aarch64
  wheels; the build's CUDA import; the flag parser). The machine resolves pypi.org and
  files.pythonhosted.org as this one does (the box fetches its engine's wheels itself).
- the fork (kacper-daftcode/vLLM-Moet's shape): a git repository of ours served over HTTP on
  loopback, a series of two patches of ours against the real vLLM 0.24.0 files (the fork's
  VLLM_MOE_W2* reads and the checkpoint's architecture registered; then "patch 12", the scheduler
  fix), cubins, a guide; commits `good`, `next` (one more edit), `broken` (its first patch made
  against another release: it does not apply) and `no-model` (patches that register no
  architecture).
- DeepGEMM (deepseek-ai/DeepGEMM's shape as far as the install needs): a git repository of ours
  served beside the fork, one commit (info.json `deepgemm`): a `deep_gemm` package whose
  version carries `+<git rev-parse --short HEAD>` as DeepGEMM's setup.py makes it, built by a
  pure-Python in-tree PEP 517 backend (the real one compiles CUDA with nvcc through setuptools
  and torch's cpp_extension; nothing compiles here), no submodules (the real one has cutlass
  and fmt).
- the hub: sandbox/fake_hub.py serving the small stand-in checkpoint (sandbox/fake_model.py) as
  zai-org/GLM-5.3-Flash and a stand-in drafter as incoai/GLM-5.3-Flash-DFlash2 at the commit the
  public recipes pin.
State in .sandbox/gb10/ (info.json: ports, commits, the hub); the machine is glm-flash-gb10-<id>.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sandbox as sb  # noqa: E402  (the L40S sandbox's helpers: image, ports, pidfiles)

STATE = sb.STATE / "gb10"
ROOTFS = STATE / "rootfs"
KEYS = STATE / "keys"
INFO = STATE / "info.json"
PIDFILE = STATE / "nspawn.pid"
HUB_PIDFILE = STATE / "hub.pid"
FORK_PIDFILE = STATE / "fork.pid"
MACHINE = f"glm-flash-gb10-{sb.IDENTITY}"
STANDIN = Path("srv/glm-flash-standin")  # inside the machine (the stand-in python reads it)
FORK_WWW = STATE / "fork-www"
FORK_NAME = "vLLM-Moet.git"
DEEPGEMM_NAME = "DeepGEMM.git"  # served beside the fork
HUB_DIR = STATE / "hub"
MODEL_REPO = "zai-org/GLM-5.3-Flash"
DRAFTER_REPO = "incoai/GLM-5.3-Flash-DFlash2"
DRAFTER_COMMIT = "bf582e4eacc1810f76656d1811693ff6c6737d2a"  # the commit public recipes pin (the default)
PY312 = Path(os.environ.get("GLM_FLASH_PYTHON312_SOURCE", "/root/.pyenv/versions/3.12.1"))
PARSER_DUMP = HERE / "vllm-0.24.0-parser.json"  # vLLM 0.24.0's serve parser (tests/gb10 check it is the real one's)
VLLM_VERSION = "0.24.0"
PATCH = "patch/vllm-moet-v0.24.0.patch"
# The fork's patches are a series (the field report's scheduler fix is its "patch 12"): the stand-in
# has two, the inventory lists both (fork_patches), and the second edits what the first left.
PATCH_12 = "patch/0012-mamba-block-aligned-split.patch"
SERIES = [PATCH, PATCH_12]
REGISTRY = "vllm/model_executor/models/registry.py"
# The checkpoint's architecture (sandbox/fake_model.py config.json); vLLM 0.24.0 has none for it.
ARCH = "Glm5NextForConditionalGeneration"
MODEL_MODULE = "vllm/model_executor/models/glm5_next.py"
REGISTRY_ANCHOR = '    "Glm4MoeLiteForCausalLM": ("glm4_moe_lite", "Glm4MoeLiteForCausalLM"),\n'
KERNELS = "kernels/cubins-sm120"
SCHEDULER = "vllm/v1/core/sched/scheduler.py"
ENVS = "vllm/envs.py"
MOE_MODULE = "vllm/model_executor/layers/quantization/utils/moe_w2_cubit.py"
# The Mamba-block fix of the field report ("patch 12"), as files/glm-flash-fork-patch recognises it.
BUG = "            block_size = self.cache_config.block_size\n"
FIX = (
    "            block_size = next(\n"
    "                (\n"
    "                    g.kv_cache_spec.block_size\n"
    "                    for g in self.kv_cache_config.kv_cache_groups\n"
    '                    if type(g.kv_cache_spec).__name__ == "MambaSpec"\n'
    "                ),\n"
    "                self.cache_config.block_size,\n"
    "            )\n"
)
FORK_SETTINGS = (
    "VLLM_MOE_W2",
    "VLLM_MOE_W2_DELTA_GB",
    "VLLM_MOE_W2_GATE",
    "VLLM_MOE_W2_CUBIT_DIR",
    "VLLM_MOE_W2_STORE_DIR",
)

OS_RELEASE = """PRETTY_NAME="Ubuntu 24.04.3 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.3 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
UBUNTU_CODENAME=noble
"""
DGX_RELEASE = """DGX_NAME="DGX Spark"
DGX_PRETTY_NAME="NVIDIA DGX Spark"
DGX_SWBUILD_DATE="2025-10-14-11-52-07"
DGX_SWBUILD_VERSION="7.2.3"
DGX_PLATFORM="DGX Server for Spark"
"""
NVIDIA_SMI = """#!/bin/sh
# GB10 sandbox stand-in (sandbox/gb10.py). There is no GPU device on this machine. With the mode file
# saying gb10, the query the deploy's facts make answers as on a GB10 box (the deploy then expects to
# serve, and the service's start fails for the missing device); otherwise nvidia-smi answers as
# without a device. `nvidia-smi -L` (the service's preflight, the host checks) never lists one.
mode=$(cat /srv/glm-flash-standin/nvidia-smi-mode 2>/dev/null)
case "$mode:$*" in
  gb10:*--query-gpu=*) echo "0, NVIDIA GB10, 12.1, [N/A], 580.95.05"; exit 0 ;;
  *"-q -d PIDS"*) exit 0 ;;
esac
echo "No devices were found (GB10 sandbox stand-in: no GPU device on this machine)" >&2
exit 6
"""
UNAME = """#!/bin/sh
# GB10 sandbox stand-in (sandbox/gb10.py): the machine is x86_64; `uname -m` answers as a GB10 box.
case "$1" in -m|--machine) [ $# -eq 1 ] && { echo aarch64; exit 0; } ;; esac
exec /usr/bin/uname "$@"
"""
# The GX10's memory figures (tests/unit/data/gb10-meminfo.txt, 128 GB, 121.6 GiB usable); every
# other line of /proc/meminfo is this machine's at the time the sandbox is made (earlyoom reads them).
GX10_MEMINFO = {"MemTotal": 127506836, "MemFree": 123000000, "MemAvailable": 124012208}


def meminfo() -> str:
    out = []
    for line in Path("/proc/meminfo").read_text().splitlines():
        key = line.split(":")[0]
        out.append(f"{key + ':':<16}{GX10_MEMINFO[key]:>8} kB" if key in GX10_MEMINFO else line)
    return "\n".join(out) + "\n"


MEMINFO_UNIT = f"""[Unit]
Description=GB10 sandbox stand-in: the GX10's /proc/meminfo (sandbox/gb10.py)
DefaultDependencies=no
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount --bind -o ro /{STANDIN}/meminfo /proc/meminfo
"""


def say(msg: str) -> None:
    print(f"gb10-sandbox: {msg}", flush=True)


def info() -> dict:
    try:
        return json.loads(INFO.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def write_info(data: dict) -> None:
    STATE.mkdir(parents=True, exist_ok=True)
    INFO.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def ports() -> dict[str, int]:
    (
        """ssh, fork, hub, the engine's and node exporter's ports: recorded ones while free (or ours), else
    chosen away from the L40S sandbox's. The machine shares this one's network: the profile's
    defaults (8000, 9100) may be another machine's already (the L40S sandbox runs a node exporter)."""
        ""
    )
    have = info().get("ports", {})
    running = sb.alive(PIDFILE) is not None
    keep = {k: v for k, v in have.items() if running or sb.bindable(v)}
    avoid = set(sb.recorded_ports().values()) | set(keep.values())
    missing = [k for k in ("ssh", "fork", "hub", "serve", "node_exporter") if k not in keep]
    if missing:
        keep |= sb.pick_ports(missing, avoid, identity=f"gb10-{sb.IDENTITY}")
    return keep


# --- the fork -------------------------------------------------------------------------------


def release_files() -> dict[str, str]:
    """The real vLLM 0.24.0 files the stand-in patches touch, from PyPI's wheel (cached, sha256-checked)."""
    sys.path.insert(0, str(HERE.parent))
    from control import pypi_cache

    whl = pypi_cache.wheel("vllm", VLLM_VERSION, accept=("none-any", "x86_64"))
    with zipfile.ZipFile(whl) as z:
        return {rel: z.read(rel).decode() for rel in (SCHEDULER, ENVS, REGISTRY)}


def diff(rel: str, old: str | None, new: str) -> str:
    a = [] if old is None else old.splitlines(keepends=True)
    lines = difflib.unified_diff(
        a, new.splitlines(keepends=True), "/dev/null" if old is None else f"a/{rel}", f"b/{rel}", n=3
    )
    head = f"diff --git a/{rel} b/{rel}\n" + ("new file mode 100644\n" if old is None else "")
    return head + "".join(lines)


def fork_patches(files: dict[str, str], edit: str, broken: bool = False, model: bool = True) -> dict[str, str]:
    """Patches of ours in the fork's shape, a series of two: the first edits envs.py, adds the fork's
    module that reads its VLLM_MOE_W2* settings and registers the checkpoint's architecture (a model
    module of ours and its line in vLLM's registry table); the second ("patch 12") is the scheduler
    fix, and also edits envs.py after the first (so it applies only in the series' order).
    `broken`: the first made against another release (does not apply). `model` False: nothing
    registers the architecture (the release's registry as it is)."""
    sched, envs, registry = files[SCHEDULER], files[ENVS], files[REGISTRY]
    assert sched.count(BUG) == 1, "vLLM 0.24.0's scheduler no longer has the line the stand-in fork edits"
    assert registry.count(REGISTRY_ANCHOR) == 1, "vLLM 0.24.0's registry no longer has the line the stand-in edits"
    base = envs.splitlines(keepends=True)
    if broken:
        base[-1] = "# a last line vLLM 0.24.0 does not have\n"
    module = '"""Stand-in of the module the fork adds (moe_w2 cubit kernels)."""\nimport os\n\n' + "".join(
        f'{name} = os.environ.get("{name}", "")\n' for name in FORK_SETTINGS
    )
    first_envs = "".join(base) + f"# {edit}\n"
    first = diff(ENVS, "".join(base), first_envs) + diff(MOE_MODULE, None, module)
    if model:
        entry = f'    "{ARCH}": ("glm5_next", "{ARCH}"),\n'
        first += diff(REGISTRY, registry, registry.replace(REGISTRY_ANCHOR, REGISTRY_ANCHOR + entry))
        first += diff(
            MODEL_MODULE,
            None,
            f'"""Stand-in of the model the fork adds (glm-flash GB10 sandbox): its class, no weights."""\n\n\n'
            f"class {ARCH}:\n    pass\n",
        )
    second = diff(SCHEDULER, sched, sched.replace(BUG, FIX)) + diff(
        ENVS, first_envs, first_envs + "# the fork's patch 12 (stand-in)\n"
    )
    return {PATCH: first, PATCH_12: second}


def git(*args: str, cwd: Path) -> str:
    env = dict(os.environ, GIT_AUTHOR_DATE="2026-01-01T00:00:00Z", GIT_COMMITTER_DATE="2026-01-01T00:00:00Z")
    return subprocess.run(
        ["git", "-c", "user.name=glm-flash sandbox", "-c", "user.email=sandbox@example.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
        env=env,
    ).stdout.strip()


def build_fork() -> dict[str, str]:
    """The stand-in fork, bare, under FORK_WWW (served over git's HTTP protocol): branch -> commit."""
    files = release_files()
    work = STATE / "fork-work"
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(FORK_WWW, ignore_errors=True)
    work.mkdir(parents=True)
    git("init", "-q", "-b", "good", cwd=work)
    (work / KERNELS / "exl3-wave-m8").mkdir(parents=True)
    (work / KERNELS / "moe_w2_mm_k6144_a32.cubin").write_bytes(b"\x7fELF stand-in cubin")
    (work / KERNELS / "exl3-wave-m8" / "k1_m8.cubin").write_bytes(b"\x7fELF stand-in cubin")
    (work / "docs").mkdir()
    (work / "docs" / "GLM-5.3-Flash.md").write_text(
        "# GLM-5.3-Flash (stand-in guide)\n\nServe with VLLM_MOE_W2=1 VLLM_MOE_W2_DELTA_GB=2.\n"
    )
    (work / "patch").mkdir()
    commits = {}
    for branch, edit, broken, model in (
        ("good", "glm-flash stand-in fork edit", False, True),
        ("next", "glm-flash stand-in fork edit, v2", False, True),
        ("broken", "glm-flash stand-in fork edit, other release", True, True),
        ("no-model", "glm-flash stand-in fork edit, no model", False, False),
    ):
        if branch != "good":  # the others all follow `good`
            git("checkout", "-q", "-B", branch, "good", cwd=work)
        for rel, text in fork_patches(files, edit, broken, model).items():
            (work / rel).write_text(text)
        git("add", "-A", cwd=work)
        git("commit", "-qm", f"stand-in fork: {branch}", cwd=work)
        commits[branch] = git("rev-parse", "HEAD", cwd=work)
    FORK_WWW.mkdir(parents=True)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(FORK_WWW / FORK_NAME)], check=True)
    git("update-server-info", cwd=FORK_WWW / FORK_NAME)
    shutil.rmtree(work)
    return commits


DEEPGEMM_BACKEND = '''"""Stand-in of DeepGEMM's build (glm-flash GB10 sandbox): pure Python, nothing compiled.
The real setup.py compiles deep_gemm_cpp with nvcc; like it, the version carries +<short HEAD>."""
import base64, hashlib, os, subprocess, zipfile

NAME = "deep_gemm"


def _version():
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    ns = {}
    exec(open(os.path.join(NAME, "__init__.py")).read(), ns)
    return ns["__version__"] + (f"+{rev}" if rev else "")


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    version = _version()
    info = f"{NAME}-{version}.dist-info"
    files = {f"{NAME}/{n}": open(os.path.join(NAME, n), "rb").read() for n in sorted(os.listdir(NAME))
             if n.endswith(".py")}
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {version}\\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\\nGenerator: glm-flash-standin\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(data)}\\n"
    files[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\\n").encode()
    wheel = f"{NAME}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, wheel), "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel
'''


def build_deepgemm() -> dict[str, str]:
    """The stand-in DeepGEMM, bare, under FORK_WWW beside the fork: {"good": commit}."""
    work = STATE / "deepgemm-work"
    shutil.rmtree(work, ignore_errors=True)
    (work / "deep_gemm").mkdir(parents=True)
    git("init", "-q", "-b", "nv-dev", cwd=work)
    (work / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "standin_build"\nbackend-path = ["."]\n\n'
        '[project]\nname = "deep_gemm"\ndynamic = ["version"]\n'
    )
    (work / "standin_build.py").write_text(DEEPGEMM_BACKEND)
    (work / "deep_gemm" / "__init__.py").write_text(
        '"""Stand-in of DeepGEMM (glm-flash GB10 sandbox): no kernels."""\n__version__ = "2.3.0"\n'
    )
    git("add", "-A", cwd=work)
    git("commit", "-qm", "stand-in DeepGEMM", cwd=work)
    commit = git("rev-parse", "HEAD", cwd=work)
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(FORK_WWW / DEEPGEMM_NAME)], check=True)
    git("update-server-info", cwd=FORK_WWW / DEEPGEMM_NAME)
    shutil.rmtree(work)
    return {"good": commit}


# --- the machine ----------------------------------------------------------------------------


def reach_pypi(root: Path) -> None:
    """The box fetches the engine's wheels from PyPI itself, so the machine reaches PyPI as this one
    does: PyPI's two names resolve to the addresses they have here (a CI machine may reach PyPI through
    an address its /etc/hosts gives), and the certificate authorities this machine's administrator
    added (/usr/local/share/ca-certificates: a CI machine's egress proxy signs with its own) are
    trusted there too, in the bundle uv reads and where update-ca-certificates keeps them."""
    lines = []
    for name in ("pypi.org", "files.pythonhosted.org"):
        try:
            address = socket.getaddrinfo(name, 443, type=socket.SOCK_STREAM)[0][4][0]
        except OSError as e:
            sys.exit(f"gb10-sandbox: cannot resolve {name} here ({e}); the GB10 build fetches its wheels from PyPI")
        lines.append(f"{address}\t{name}\n")
    with open(root / "etc/hosts", "a") as f:
        f.write("# PyPI as the control machine reaches it (sandbox/gb10.py reach_pypi)\n" + "".join(lines))
    added = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    (root / "usr/local/share/ca-certificates").mkdir(parents=True, exist_ok=True)
    for crt in added:
        shutil.copy(crt, root / "usr/local/share/ca-certificates" / crt.name)
    with open(root / "etc/ssl/certs/ca-certificates.crt", "a") as bundle:
        bundle.write("".join(crt.read_text() for crt in added))


def stage_python(root: Path) -> None:
    """A real CPython 3.12 laid out as DGX OS's (/usr/bin/python3.12, /usr/lib/python3.12), with the
    stand-in sitecustomize (sandbox/gb10_python.py). Debian 13 has no python3.12 to collide with."""
    if not (PY312 / "bin" / "python3.12").exists():
        sys.exit(
            f"gb10-sandbox: no CPython 3.12 at {PY312}; set GLM_FLASH_PYTHON312_SOURCE to one (pyenv install 3.12)"
        )
    skip = shutil.ignore_patterns("test", "__pycache__", "idlelib", "tkinter", "_sandboxing_*.pth")
    shutil.copytree(PY312 / "lib/python3.12", root / "usr/lib/python3.12", symlinks=True, ignore=skip)
    shutil.copytree(PY312 / "include/python3.12", root / "usr/include/python3.12", symlinks=True)
    for lib in (PY312 / "lib").glob("libpython3.12.so*"):
        shutil.copy(lib, root / "usr/lib" / lib.name, follow_symlinks=False)
    shutil.copy(PY312 / "bin/python3.12", root / "usr/bin/python3.12")
    shutil.copy(HERE / "gb10_python.py", root / "usr/lib/python3.12/sitecustomize.py")
    sb.run(["ldconfig", "-r", str(root)])


def keys() -> None:
    KEYS.mkdir(parents=True, exist_ok=True)
    for name in ("id_ed25519", "ssh_host_ed25519_key"):
        if not (KEYS / name).exists():
            sb.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"glm-flash-gb10-{name}", "-f", str(KEYS / name)]
            )


def write_client_files(port: int) -> None:
    pub = (KEYS / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    (STATE / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(pub)}\n")
    (STATE / "ssh_config").write_text(
        f"Host gb10\n  HostName 127.0.0.1\n  Port {port}\n  User root\n"
        f"  IdentityFile {KEYS / 'id_ed25519'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {STATE / 'known_hosts'}\n  StrictHostKeyChecking yes\n"
        f"  ControlMaster auto\n  ControlPath {sb.control_dir()}/gb10-%C\n  ControlPersist 60s\n"
    )


def create_rootfs(port: int) -> None:
    say("unpacking a bare Debian 13 machine and making it look like a GB10 box")
    tmp = sb.unpacked(STATE / "rootfs.partial", "gx10", KEYS)
    root = tmp
    # DGX OS's release files (Debian's /etc/os-release is a link to /usr/lib/os-release: left there).
    (root / "etc/os-release").unlink()
    (root / "etc/os-release").write_text(OS_RELEASE)
    (root / "etc/dgx-release").write_text(DGX_RELEASE)
    for path, text in ((root / "usr/bin/nvidia-smi", NVIDIA_SMI), (root / "usr/local/bin/uname", UNAME)):
        path.write_text(text)
        path.chmod(0o755)
    (root / "usr/local/cuda-13.0").mkdir(parents=True)
    (root / "usr/local/cuda-13.0/version.json").write_text('{"cuda": {"version": "13.0.88"}}\n')
    stage_python(root)
    reach_pypi(root)
    # /proc/meminfo: the GX10's, bind-mounted over the kernel's early at boot (as lxcfs does)
    (root / STANDIN).mkdir(parents=True)
    (root / STANDIN / "meminfo").write_text(meminfo())
    (root / "etc/systemd/system/standin-meminfo.service").write_text(MEMINFO_UNIT)
    wants = root / "etc/systemd/system/sysinit.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    (wants / "standin-meminfo.service").symlink_to("/etc/systemd/system/standin-meminfo.service")
    tmp.rename(ROOTFS)
    write_sshd(port)


def write_sshd(port: int) -> None:
    (ROOTFS / "etc/ssh/sshd_config.d/sandbox.conf").write_text(
        f"# The GB10 sandbox shares the host's network: sshd on a loopback port (.sandbox/gb10/info.json).\n"
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey /etc/ssh/ssh_host_ed25519_key\n"
    )


def stage_parser() -> None:
    """vLLM 0.24.0's serve parser as the flag check's replica reads it: the repository's dump
    (tests/gb10/test_parser_dump.py keeps it equal to the real parser's), so `up` needs no flag."""
    shutil.copy(PARSER_DUMP, ROOTFS / STANDIN / "vllm-0.24.0-parser.json")


def stage_hub() -> dict:
    from fake_model import write_model

    shutil.rmtree(HUB_DIR, ignore_errors=True)
    model = write_model(HUB_DIR / "model")
    drafter = HUB_DIR / "drafter"
    drafter.mkdir(parents=True)
    (drafter / "config.json").write_text(
        json.dumps({"architectures": ["DFlashDraftModel"], "model_type": "dflash", "stand_in": True}, indent=2) + "\n"
    )
    (drafter / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    digest = hashlib.sha1()
    for f in sorted(model.rglob("*")):
        if f.is_file():
            digest.update(f.relative_to(model).as_posix().encode() + b"\0" + f.read_bytes())
    return {
        "model": {"repo": MODEL_REPO, "commit": digest.hexdigest()},
        "drafter": {"repo": DRAFTER_REPO, "commit": DRAFTER_COMMIT},
    }


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def serve(pidfile: Path, port: int, cmd: list[str], what: str) -> None:
    if sb.alive(pidfile) and port_open(port):
        return
    sb.stop_pidfile(pidfile)
    log = open(STATE / f"{pidfile.stem}.log", "ab")
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    for _ in range(40):
        if proc.poll() is None and port_open(port):
            return
        time.sleep(0.25)
    sys.exit(f"gb10-sandbox: {what} did not start on 127.0.0.1:{port}; see {STATE / (pidfile.stem + '.log')}")


def ssh(command: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-F", str(STATE / "ssh_config"), "gb10", command], capture_output=True, text=True, timeout=timeout
    )


def prepare() -> dict:
    """Everything but the boot: ports, keys, the machine's files, the fork, the hub's files."""
    data = info()
    p = ports()
    keys()
    write_client_files(p["ssh"])
    if not ROOTFS.exists():
        create_rootfs(p["ssh"])
        data["commits"] = build_fork()
        data["deepgemm"] = build_deepgemm()
        data["hub"] = stage_hub()
    write_sshd(p["ssh"])
    stage_parser()
    data["ports"] = p
    write_info(data)
    return data


def up() -> None:
    data = prepare()
    p, hub = data["ports"], data["hub"]
    serve(
        HUB_PIDFILE,
        p["hub"],
        [
            sys.executable,
            str(HERE / "fake_hub.py"),
            "--repo",
            hub["model"]["repo"],
            "--dir",
            str(HUB_DIR / "model"),
            "--commit",
            hub["model"]["commit"],
            "--also",
            hub["drafter"]["repo"],
            str(HUB_DIR / "drafter"),
            hub["drafter"]["commit"],
            "--port",
            str(p["hub"]),
            "--log",
            str(STATE / "hub-requests.log"),
        ],
        "the stand-in hub",
    )
    serve(
        FORK_PIDFILE,
        p["fork"],
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(FORK_WWW), str(p["fork"])],
        "the stand-in fork's git server",
    )
    if sb.alive(PIDFILE):
        say(f"already running (ssh -F {STATE / 'ssh_config'} gb10)")
        return
    if port_open(p["ssh"]):
        sys.exit(f"gb10-sandbox: 127.0.0.1:{p['ssh']} is in use; run `sandbox/gb10.py down` and up again")
    sb.inotify_room()
    say(f"booting {MACHINE} (sshd on 127.0.0.1:{p['ssh']})")
    log = open(STATE / "boot.log", "ab")
    proc = subprocess.Popen(
        [
            "systemd-nspawn",
            "-b",
            "-D",
            str(ROOTFS),
            "-M",
            MACHINE,
            "--register=no",
            "--keep-unit",
            "--console=passive",
            "--resolv-conf=copy-host",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        env=dict(os.environ, SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1"),
        start_new_session=True,
    )
    PIDFILE.write_text(str(proc.pid))
    deadline = time.time() + sb.BOOT_TIMEOUT
    while time.time() < deadline:
        if proc.poll() is not None:
            PIDFILE.unlink(missing_ok=True)
            sys.exit(f"gb10-sandbox: systemd-nspawn exited ({proc.returncode}); see {STATE / 'boot.log'}")
        if port_open(p["ssh"]):
            r = ssh("systemctl is-system-running --wait >/dev/null 2>&1; true")
            if r.returncode == 0:
                say(f"up: ssh -F {STATE / 'ssh_config'} gb10")
                return
        time.sleep(0.5)
    down()
    sys.exit(f"gb10-sandbox: SSH did not answer within {sb.BOOT_TIMEOUT} s; see {STATE / 'boot.log'}")


def down() -> None:
    sb.stop_pidfile(HUB_PIDFILE)
    sb.stop_pidfile(FORK_PIDFILE)
    if sb.poweroff(PIDFILE):
        say("down")
    for sock in sb.control_dir().glob("gb10-*"):
        sock.unlink(missing_ok=True)


def destroy() -> None:
    down()
    for path in (ROOTFS, STATE / "rootfs.partial", HUB_DIR, FORK_WWW, STATE / "fork-work", STATE / "deepgemm-work"):
        shutil.rmtree(path, ignore_errors=True)
    INFO.unlink(missing_ok=True)
    say("machine deleted")


def main() -> None:
    if os.geteuid() != 0:
        sys.exit("gb10-sandbox: run as root (systemd-nspawn needs it)")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("up", "prepare", "down", "fresh", "destroy", "status", "gpu"))
    ap.add_argument("mode", nargs="?", choices=("gb10", "none"), help="gpu: what nvidia-smi's query answers")
    a = ap.parse_args()
    STATE.mkdir(parents=True, exist_ok=True)
    if a.action == "up":
        up()
    elif a.action == "gpu":
        (ROOTFS / STANDIN / "nvidia-smi-mode").write_text(f"{a.mode or 'none'}\n")
    elif a.action == "prepare":
        prepare()
    elif a.action == "fresh":
        destroy()
        up()
    elif a.action == "down":
        down()
    elif a.action == "destroy":
        destroy()
    else:
        print("running" if sb.alive(PIDFILE) else "stopped")


if __name__ == "__main__":
    main()
