"""The built-in sandbox: Debian 13 in systemd-nspawn on this machine (`make sandbox-up`).

No GPU: every GPU step is reported as skipped with its reason. NVIDIA's repository and the
CUDA runfile are a stand-in that `make sandbox-up` builds and serves on loopback
(sandbox/nvidia_standin.py: NVIDIA's layout and package names, a test key, files not drivers).
"""

import json
import os
from pathlib import Path

from control.profile import hosts

# This checkout's ports: `make sandbox-up` chose them and recorded them in .sandbox/ports.json
# (sandbox/sandbox.py); GLM_FLASH_SANDBOX_PORT / GLM_FLASH_STANDIN_PORT pin them as they pinned it.
PORTS_FILE = Path(".sandbox/ports.json")
if not PORTS_FILE.exists():
    raise SystemExit(
        "glm-flash: the sandbox has no ports yet (.sandbox/ports.json). Fix: make sandbox-up, then run this again"
    )
ports = json.loads(PORTS_FILE.read_text())
if not {"engine", "node_exporter"} <= set(ports):
    raise SystemExit(
        "glm-flash: .sandbox/ports.json is from an older checkout (no engine port). Fix: make sandbox-up, then run this again"
    )
PORT = int(os.environ.get("GLM_FLASH_SANDBOX_PORT") or ports["ssh"])
_standin_default = (
    int(os.environ["GLM_FLASH_SANDBOX_PORT"]) + 6000 if os.environ.get("GLM_FLASH_SANDBOX_PORT") else ports["standin"]
)
STANDIN_URL = f"http://127.0.0.1:{os.environ.get('GLM_FLASH_STANDIN_PORT') or _standin_default}"
STANDIN_INFO = Path(".sandbox/rootfs/srv/glm-flash-standin/standin.json")  # /srv/... inside the sandbox
if not STANDIN_INFO.exists():
    raise SystemExit(
        "glm-flash: the sandbox is not built yet (no stand-in NVIDIA repository). "
        "Fix: make sandbox-up (or make demo), then run this again"
    )
standin = json.loads(STANDIN_INFO.read_text())
# The stand-in hub (sandbox/sandbox.py: sandbox/fake_hub.py serving sandbox/fake_model.py's checkpoint).
HUB_INFO = Path(".sandbox/hub/hub.json")
if not HUB_INFO.exists():
    raise SystemExit(
        "glm-flash: the sandbox's stand-in hub is not staged yet. Fix: make sandbox-up (or make demo), then run this again"
    )
hub = json.loads(HUB_INFO.read_text())

hosts = hosts(
    (
        "sandbox",
        {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": PORT,
            # As on a stock Debian 13 or DGX OS box: root cannot log in with a password, the
            # installer's user has sudo (sandbox/sandbox.py USER); the deploy runs through it.
            "ssh_user": "glm",
            "_sudo": True,
            "ssh_key": ".sandbox/keys/id_ed25519",
            "ssh_known_hosts_file": ".sandbox/known_hosts",
            "ssh_strict_host_key_checking": "yes",
            "require_gpu": False,
            # The machine shares this one's network: this checkout's own ports (another checkout's
            # sandbox, or a real engine on this machine, may hold SGLang's 30000 and the exporter's 9100).
            "port": ports["engine"],
            "node_exporter_port": ports["node_exporter"],
            # Simulated NVIDIA sources (see above): same shape and checks as the real ones.
            "nvidia_repo_url": f"{STANDIN_URL}/{standin['repo_path']}/",
            "nvidia_repo_key_url": f"file:///srv/glm-flash-standin/{standin['key_file']}",
            "nvidia_repo_key_fingerprint": standin["fingerprint"],
            "cuda_runfile_url": f"{STANDIN_URL}/{standin['runfile_path']}",
            "cuda_runfile_sha256": standin["runfile_sha256"],
            # Simulated hub: the real checkpoint is 306 GiB and the hub cannot be reached here, so the
            # deploy downloads a small stand-in with the real config.json keys from a hub on loopback,
            # through the same huggingface-hub code path (HF_ENDPOINT). Its commit is pinned here.
            "model_path": "/srv/models/GLM-5.3-Flash",
            "model_download": True,
            "model_id": hub["repo"],
            "model_revision": hub["commit"],
            "hf_endpoint": f"http://127.0.0.1:{hub['port']}",
            "allow_reboot": False,
            # Preflight against this machine (2 cores, memory shared with the control machine): no
            # engine loads here and the stand-in checkpoint is small; disk is checked as on a real box.
            "kt_cpuinfer": 2,
            # The sandbox runs on the control machine's CPU, with or without AVX-512 (CI machines have
            # been both): the CPU-flag check is proven by tests/sandbox/test_preflight_summary.py instead.
            "preflight_cpu_flags": [],
            "preflight_memory_gib": 2,
            "preflight_model_gib": 1,
            # An environment is about 11 GiB (the default); the sandbox's disk is the control
            # machine's, shared with its own caches and checkouts: a smaller floor keeps it deployable.
            "preflight_engine_env_gib": 6,
            # The stand-in CUDA runfile and its toolkit are a few files (sandbox/nvidia_standin.py), not 20 GiB.
            "preflight_cuda_runfile_gib": 0.1,
            "preflight_cuda_extract_gib": 0.1,
            "preflight_cuda_toolkit_gib": 0.1,
            # The engine's CPython 3.11 comes from the control machine (pyenv on these machines).
            "python_source": os.environ.get("GLM_FLASH_PYTHON_SOURCE", "/root/.pyenv/versions/3.11.7"),
        },
    ),
)
