"""/etc/glm-flash/status.json: the few profile values `glm-flash status` compares the host with.

Nothing else on the host holds them (the driver branch, the key fingerprint, cuDNN, ...).
Root's own 0644 file without secrets: the API key and the hub token never go in it.
"""

from __future__ import annotations

import json
from io import StringIO

from control.layout import STATUS_FILE
from control.profile import Profile
from roles.operations import paths
from roles.operations.driver import KEYRING, SOURCES_FILE

PATH = STATUS_FILE
KEYS = (
    "platform",
    "gpu_count",
    "gpu_compute_capability",
    "require_gpu",
    "driver_source",
    "driver_branch",
    "driver_min_version",
    "nvidia_repo_url",
    "nvidia_repo_key_fingerprint",
    "cuda_version",
    "fix_cuda_header",
    "engine_set",
    "cudnn_version",
    "install_root",
    "model_id",
    "model_revision",
    "model_path",
    "model_download",
    "drafter_model",
    "drafter_revision",
    "service_user",
    "listen_host",
    "port",
    "served_model_name",
    "python_version",
    "vllm_ref",
    "fork_patches",
    "scheduler_fix_verified_ref",
    "deepgemm_ref",
    "memory_guard_gib",
    "metrics",
)


def own_address(profile: Profile) -> str:
    """The node's own address as its files carry it (the closure hash replaces it with a placeholder)."""
    if profile.fleet_own_address:
        return profile.fleet_own_address
    return "" if profile.listen_host in ("0.0.0.0", "::", "127.0.0.1", "::1", "localhost") else profile.listen_host


def values(profile: Profile) -> dict:
    data = {k: getattr(profile, k) for k in KEYS}
    data.update(nvidia_keyring=KEYRING, nvidia_sources=SOURCES_FILE, own_address=own_address(profile))
    return data


def apply(profile: Profile) -> None:
    # /etc/glm-flash itself is the service role's (root:service user 0750); this file stays root's.
    paths.put(
        StringIO(json.dumps(values(profile), indent=1, sort_keys=True) + "\n"),
        PATH,
        user="root",
        group="root",
        mode="644",
        name=f"Profile values for glm-flash status ({PATH})",
    )
