"""One ASUS Ascent GX10 / DGX Spark (GB10, aarch64, DGX OS) serving GLM-5.3-Flash with the
vLLM-Moet fork and the DFlash2 drafter. `platform: gb10` brings the GB10 defaults
(control/defaults.py PLATFORMS); set only what differs here.

Before the first deploy (README, "GB10 box"): your host's name, your SSH key, its verified key
in inventory/local/known_hosts, the fork's commit, and your own decision on the drafter's licence.
Until then this inventory is refused before any host is contacted.

    mkdir -p inventory/local && cp inventory/gb10.py inventory/local/   # yours; git ignores it
    .venv/bin/pyinfra inventory/local/gb10.py deploy.py
"""

from control.profile import hosts

hosts = hosts(
    (
        "gx10.example.lan",
        {
            "platform": "gb10",
            # The user the installer created, with passwordless sudo (README, First real host): a
            # stock Debian 13 or DGX OS box refuses root over SSH. Logging in as root: drop _sudo.
            "ssh_user": "glm",
            "_sudo": True,
            "ssh_key": "~/.ssh/id_ed25519",
            "ssh_known_hosts_file": "inventory/local/known_hosts",
            "ssh_strict_host_key_checking": "yes",
            # The fork, pinned to a commit (a tag or branch is refused: it moves).
            "vllm_repo_url": "https://github.com/lrozewicz/vLLM-Moet-GB10",
            "vllm_ref": "0000000000000000000000000000000000000000",  # replace: git ls-remote <repo> v0.3.0
            # incoai/GLM-5.3-Flash-DFlash2 is CC-BY-NC-ND-4.0 (non-commercial, no derivatives).
            # Set True yourself, only after reading https://creativecommons.org/licenses/by-nc-nd/4.0/
            "accept_drafter_license": False,
            # The FP8 checkpoint (306 GiB) is downloaded to /srv/models/GLM-5.3-Flash; the fork builds its
            # 2-bit expert planes from it at load.
            # "listen_host": "0.0.0.0",   # needs GLM_FLASH_API_KEY exported on this machine
        },
    ),
)
