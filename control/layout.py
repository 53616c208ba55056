"""Where things live, on the host and on the control machine: every path the roles agree on.

Host paths derive from two knobs (install_root, service_user); nothing else builds them
(tests/unit/test_layout_paths.py reads the other modules for one). The repo root is REPO.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FILES = REPO / "files"  # host tools, uploaded as they are
HOST_MODULE = "glm_flash_host.py"  # in files/: what the host tools share, installed beside each of them
TEMPLATES = REPO / "templates"
PATCHES = REPO / "patches"
LOCKS = REPO / "locks"

SBIN = "/usr/local/sbin"  # links to our host tools, on root's PATH
CONF_DIR = "/etc/glm-flash"  # root-owned; the service user may read, never write
STATUS_FILE = f"{CONF_DIR}/status.json"
# Root only (0700): secrets staged before their rename into place, the hub token while the
# download's unit exists (it reads it at every start; roles/operations/secrets.py, checkpoint.py).
SECRETS_DIR = f"{CONF_DIR}/secrets"
ENV_FILE = f"{CONF_DIR}/glm-flash.env"  # the engine's environment, read by the unit
LAUNCH_SPEC = f"{CONF_DIR}/launch.json"  # the engine's command line, as glm-flash-engine runs it
API_KEY = f"{CONF_DIR}/api-key"
SYSTEMD_DIR = "/etc/systemd/system"
UNIT = "/etc/systemd/system/glm-flash.service"
GPU_UNIT = "/etc/systemd/system/glm-flash-gpu.service"
LOG_DIR = "/var/log/glm-flash"
CACHE_DIR = "/var/cache/glm-flash"  # root's downloads on the host
CUDA_RUNFILE_CACHE = f"{CACHE_DIR}/cuda"  # files/glm-flash-nvidia-repo: NVIDIA's runfile (5.4 GB)
FETCH_CACHE = "/var/cache/glm-flash-fetch"  # the download unit's CacheDirectory= (made by systemd), its HF_HOME
CUDA_HEADER_LOG = f"{LOG_DIR}/cuda-header.log"  # the dpkg hook's runs of the header fix
# The fleet's router (roles/fleet/gateway.py); its environment lives under the gateway_dir knob.
GATEWAY_CONF_DIR = "/etc/glm-flash-gateway"
GATEWAY_UNIT = "/etc/systemd/system/glm-flash-gateway.service"
# Its front door (nginx: TLS, the OpenAI routes only), and the mask on Debian's own nginx.service.
FRONT_UNIT = "/etc/systemd/system/glm-flash-front.service"
NGINX_MASK = "/etc/systemd/system/nginx.service"
# The GB10 memory guard's drop-in on earlyoom's own unit (roles/memory_guard.py).
EARLYOOM_DROP_IN = "/etc/systemd/system/earlyoom.service.d/glm-flash.conf"
# Watching the node (roles/watch.py): node-exporter's drop-in, our textfile directory and the
# GPU collector's units; the failure notifier's template unit, its settings, secret and record.
NODE_EXPORTER_DROP_IN = "/etc/systemd/system/prometheus-node-exporter.service.d/glm-flash.conf"
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"  # the Debian package's binary
TEXTFILE_DIR = "/var/lib/glm-flash-metrics"  # node-exporter's textfile collector reads *.prom here
GPU_METRICS_FILE = f"{TEXTFILE_DIR}/glm_flash_gpu.prom"
GPU_METRICS_SERVICE = "/etc/systemd/system/glm-flash-gpu-metrics.service"
GPU_METRICS_TIMER = "/etc/systemd/system/glm-flash-gpu-metrics.timer"
NOTIFY_UNIT = "/etc/systemd/system/glm-flash-notify@.service"
NOTIFY_CONF_DIR = "/etc/glm-flash-notify"  # root's, 0755: the command (not secret) and the webhook (0600)
NOTIFY_CONF = f"{NOTIFY_CONF_DIR}/notify.json"
NOTIFY_WEBHOOK = f"{NOTIFY_CONF_DIR}/webhook"
NOTIFY_STAGE_DIR = f"{NOTIFY_CONF_DIR}/.secrets"  # root only: the webhook before its rename
NOTIFY_STATE = "/var/lib/glm-flash-notify"  # the notifier's StateDirectory=
LAST_FAILURE = f"{NOTIFY_STATE}/last-failure.json"  # read by `glm-flash status` (files/glm-flash)
NOTIFY_TOOL_DIR = "/usr/local/lib/glm-flash-notify"  # the notifier itself, on worker and gateway hosts alike


def _below(base, rel: str):
    """A profile's host path: `rel` below `base`, a knob naming a directory or another path here."""

    def path(profile) -> str:
        return f"{base(profile) if callable(base) else getattr(profile, base)}{rel}"

    return path


def service_home(profile) -> str:
    """The service user's HOME and working directory: everything here is the engine's to write."""
    return f"/var/lib/{profile.service_user}"


bin_dir = _below("install_root", "/bin")
cuda_patch_dir = _below("install_root", "/patches/cuda")
# The CUDA header patch set, as the host tools read it (roles/cuda_header.py).
cuda_patch_set = _below(cuda_patch_dir, "/math_functions-12.json")
fleet_dir = _below("install_root", "/fleet")  # the fleet's manifests and markers (roles/fleet/artifacts.py)
engine_root = _below("install_root", "/engine")
# The bin/ of the environment `current` points at (its python, its ninja), and the interpreter of
# that environment: what the service runs.
engine_bin = _below(engine_root, "/current/bin")
engine_python = _below(engine_bin, "/python")
hub_venv = _below("install_root", "/tools/hf-hub")
# The uv that builds the host's Python environments (roles/operations/python.py).
host_uv = _below("install_root", "/tools/uv")
triton_moe_dir = _below("install_root", "/triton-configs/moe")
# GB10: the fork's expert store (VLLM_MOE_W2_STORE_DIR), the engine's to write, in its state directory.
moe_store_dir = _below(service_home, "/moe-w2-store")


def tool(profile, name: str) -> str:
    return f"{bin_dir(profile)}/{name}"


def interpreters_dir(install_root: str) -> str:
    """The engine interpreters' directory (the knob's value: control/python_pack.py has no profile)."""
    return f"{install_root}/python"


def site_packages(profile, env_dir: str) -> str:
    return f"{env_dir}/lib/python{profile.python_version}/site-packages"


# Root's own state: a directory only root can write (root:root 0755), never under the
# service user's home. The engine is untrusted: nothing it can write may steer what root
# writes, so the manifests root trusts, the originals it restores from, its locks and
# markers live here. The host tools take the same paths from files/glm_flash_host.py
# (tests/unit/test_root_state_paths.py keeps them equal).
ROOT_STATE = "/var/lib/glm-flash-deploy"
PATCH_STATE = f"{ROOT_STATE}/patches"  # glm-flash-patch: manifests/, originals/
PATCH_SET_DIR = "glm-flash-patches"  # in an engine environment: the patch sets applied to it
FLAG_CHECKS = f"{ROOT_STATE}/flag-checks"  # glm-flash-check-flags: launch specs the engine's parser accepted
ENGINE_CHECKS = f"{ROOT_STATE}/engine-checks"  # glm-flash-engine status: owner checks of unchanged files
INITRAMFS_MARKER = f"{ROOT_STATE}/initramfs-nouveau.sha256"  # blacklist the initramfs was built with
