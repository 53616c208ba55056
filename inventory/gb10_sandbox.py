"""The GB10 sandbox: a Debian 13 machine made to look like a GB10 box (`sandbox/gb10.py up`).

    .venv/bin/pyinfra inventory/gb10_sandbox.py deploy.py --data vllm_ref=<commit>

What is simulated and what differs from DGX OS is in sandbox/gb10.py's docstring. The fork is
the stand-in served on loopback; its commits (`good`, `next`, `broken`, `no-model`: patches that do not register the checkpoint's
architecture) are in
.sandbox/gb10/info.json; GLM_FLASH_GB10_FORK picks one by name (default `good`), `--data
vllm_ref=` overrides it. The stand-in DeepGEMM is served beside it at its one commit
(info.json `deepgemm`); GLM_FLASH_GB10_DEEPGEMM sets another commit. The profile is the GB10 one: only what this machine cannot be is set here.
"""

import json
import os
from pathlib import Path

from control.profile import hosts

INFO = Path(".sandbox/gb10/info.json")
if not INFO.exists():
    raise SystemExit(
        "glm-flash: the GB10 sandbox is not built yet. Fix: python3 sandbox/gb10.py up, then run this again"
    )
info = json.loads(INFO.read_text())
ports, hub, commits = info["ports"], info["hub"], info["commits"]

hosts = hosts(
    (
        "gb10-sandbox",
        {
            "platform": "gb10",
            "ssh_hostname": "127.0.0.1",
            "ssh_port": ports["ssh"],
            "ssh_user": "root",
            "ssh_key": ".sandbox/gb10/keys/id_ed25519",
            "ssh_known_hosts_file": ".sandbox/gb10/known_hosts",
            "ssh_strict_host_key_checking": "yes",
            # No GPU on the PCI bus (nvidia-smi is a stand-in): the GPU steps are skipped and say so.
            "require_gpu": False,
            # The machine shares this one's network (with the L40S sandbox's node exporter on 9100).
            "port": ports["serve"],
            "node_exporter_port": ports["node_exporter"],
            "allow_reboot": False,
            # The stand-in fork (a git repository of ours over HTTP on loopback) at one of its commits.
            "vllm_repo_url": f"http://127.0.0.1:{ports['fork']}/vLLM-Moet.git",
            "vllm_ref": commits[os.environ.get("GLM_FLASH_GB10_FORK", "good")],
            # Its patches are a series of two (the second, "patch 12", the scheduler fix).
            "fork_patches": ["patch/vllm-moet-v0.24.0.patch", "patch/0012-mamba-block-aligned-split.patch"],
            # The stand-in DeepGEMM beside it (pure Python: the real one compiles CUDA with nvcc) at its
            # commit; GLM_FLASH_GB10_DEEPGEMM names another commit (the test's wrong one).
            "deepgemm_repo_url": f"http://127.0.0.1:{ports['fork']}/DeepGEMM.git",
            "deepgemm_ref": os.environ.get("GLM_FLASH_GB10_DEEPGEMM") or info["deepgemm"]["good"],
            "accept_drafter_license": True,  # a stand-in drafter: no licensed file is downloaded here
            # The stand-in hub: a small checkpoint with the real config.json keys, and a stand-in drafter
            # at the commit public recipes pin (drafter_revision's default).
            "model_id": hub["model"]["repo"],
            "model_revision": hub["model"]["commit"],
            "drafter_model": hub["drafter"]["repo"],
            "hf_endpoint": f"http://127.0.0.1:{ports['hub']}",
            # Debian 13 underneath: Ubuntu's python3.12-dev does not exist here (the stand-in
            # CPython 3.12 carries its headers), and nothing is compiled (no compilers, cmake).
            # python3 as DGX OS has it (Debian's 3.13 here): uv builds the downloader's environment with it.
            "base_packages": ["ca-certificates", "curl", "git", "python3", "pciutils", "jq"],
            # Preflight against this machine (2 cores, a disk shared with the control machine):
            # the stand-in checkpoint is small and no engine loads; /proc/meminfo is the GX10's.
            "preflight_model_gib": 1,
            "preflight_engine_env_gib": 2,
            "preflight_moe_store_gib": 0,
            "preflight_drafter_gib": 0.1,
        },
    ),
)
