"""2x L40S + EPYC node (field report seeds/000). Set only what differs from roles/defaults.py."""

from roles.profile import hosts

hosts = hosts(
    ("gpu1.example.lan", {
        "ssh_user": "root",
        "ssh_key": "~/.ssh/id_ed25519",
        # "kt_cpuinfer": 152,          # cores for CPU experts (EPYC 9845: 160)
        # "model_path": "/srv/models/GLM-5.3-Flash",
        # "listen_host": "0.0.0.0",   # needs GLM_FLASH_API_KEY exported on this machine
    }),
)
