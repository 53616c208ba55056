"""The built-in sandbox: Debian 13 in systemd-nspawn on this machine (`make sandbox-up`).

No GPU: every GPU step is reported as skipped with its reason.
"""

import os

from roles.profile import hosts

hosts = hosts(
    ("sandbox", {
        "ssh_hostname": "127.0.0.1",
        "ssh_port": int(os.environ.get("GLM_FLASH_SANDBOX_PORT", "2222")),
        "ssh_user": "root",
        "ssh_key": ".sandbox/keys/id_ed25519",
        "ssh_known_hosts_file": ".sandbox/known_hosts",
        "ssh_strict_host_key_checking": "yes",
        "require_gpu": False,
        # Small for the sandbox: the real checkpoint is 306 GiB and cannot be fetched here.
        "model_path": "/srv/models/GLM-5.3-Flash",
        "model_download": False,
        "allow_reboot": False,
        # The engine's CPython 3.11 comes from the control machine (pyenv on these machines).
        "python_source": os.environ.get("GLM_FLASH_PYTHON_SOURCE", "/root/.pyenv/versions/3.11.7"),
    }),
)
