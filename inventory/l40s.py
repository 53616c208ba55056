"""2x L40S + EPYC node. Set only what differs from control/defaults.py.

Before the first deploy (README, "First real host"): write your host's name or address in
place of gpu1.example.lan, point ssh_key at your key, and put the host's verified SSH key in
inventory/local/known_hosts. Until then this inventory is refused before any host is contacted.

    mkdir -p inventory/local && cp inventory/l40s.py inventory/local/   # yours; git ignores it
    .venv/bin/pyinfra inventory/local/l40s.py deploy.py
"""

from control.profile import hosts

hosts = hosts(
    (
        "gpu1.example.lan",
        {
            # The user the installer created, with passwordless sudo (README, First real host): a
            # stock Debian 13 or DGX OS box refuses root over SSH. Logging in as root: drop _sudo.
            "ssh_user": "glm",
            "_sudo": True,
            "ssh_key": "~/.ssh/id_ed25519",
            # Connect only to the host whose key you verified: a first deploy ships secrets.
            "ssh_known_hosts_file": "inventory/local/known_hosts",
            "ssh_strict_host_key_checking": "yes",
            # "kt_cpuinfer": 152,          # cores for CPU experts (EPYC 9845: 160)
            # "model_path": "/srv/models/GLM-5.3-Flash",
            # "listen_host": "0.0.0.0",   # needs GLM_FLASH_API_KEY exported on this machine
            # The engine's CPython 3.11 (python_release) is downloaded once by the pinned uv on this
            # machine; without internet here, name a CPython 3.11 install tree instead:
            # "python_source": "~/.pyenv/versions/3.11.7",
        },
    ),
)
