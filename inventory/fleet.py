"""A fleet: L40S worker nodes that serve the same model, and one gateway in front of them.

Everything per host comes from the profile as for a single node (control/defaults.py); the
values in `shared` are set once for the whole group, so every worker serves the same thing.
A worker that sets one of them differently, or a moving model revision, is refused before any
host is contacted. Replace the example names, the model commit and the keys first (README,
"First real host"); export GLM_FLASH_API_KEY (the clients' key, the gateway's) and
GLM_FLASH_WORKER_KEY (a key of its own: the workers accept only it). Behind a gateway the
workers' engines let in only the gateway by address, so give each host's ssh_hostname as its IP
address (docs/fleet.md); a Prometheus server that scrapes the engines goes in engine_allow_from.

    mkdir -p inventory/local && cp inventory/fleet.py inventory/local/   # yours; git ignores it
    .venv/bin/pyinfra inventory/local/fleet.py deploy_fleet.py
"""

from control.fleet import fleet

ssh = {
    "ssh_user": "glm",  # the installer's user with passwordless sudo (README, First real host); root: drop _sudo
    "_sudo": True,
    "ssh_key": "~/.ssh/id_ed25519",
    "ssh_known_hosts_file": "inventory/local/known_hosts",
    "ssh_strict_host_key_checking": "yes",
}

workers, gateway = fleet(
    shared={
        "platform": "l40s",
        "engine_set": "0.7.0.post1",
        # The checkpoint's commit on the hub: "main" would let workers download different ones.
        "model_revision": "0" * 40,
        "listen_host": "0.0.0.0",  # the gateway reaches each worker at its ssh address
        # True only when the network between these machines is the fleet's alone (its own switch or
        # VLAN): the worker key and the checkpoint cross it unencrypted (docs/fleet.md). Left False,
        # a fleet off loopback is refused.
        "fleet_network_private": False,
    },
    workers=[
        ("gpu1.example.lan", {**ssh, "kt_cpuinfer": 152}),
        ("gpu2.example.lan", {**ssh, "kt_cpuinfer": 152}),
        ("gpu3.example.lan", {**ssh, "kt_cpuinfer": 152}),
    ],
    gateway=("gw.example.lan", {**ssh, "gateway_policy": "cache_aware"}),
)
