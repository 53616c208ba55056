"""The fleet sandbox (`make fleet-up N=3`): node1 is the gateway, node2.. are the workers.

Simulated: no GPU here, so the workers' engines are OpenAI-compatible stand-ins
(tests/bench/fake_openai.py) that the fleet tests run on each worker's address; this inventory
deploys the gateway (`--limit gateway`). Health checks, key, routing: the real router.
On a fleet booted from the deployed single sandbox's snapshot (FROM_SANDBOX=1) the whole fleet deploy runs.
Simulated hub: the workers download the single sandbox's small stand-in checkpoint from the
fleet's own stand-in hub on its subnet (the containers share the host's network), which logs every
request to .sandbox/fleet/hub.log.
"""

import json
import os
import runpy
from pathlib import Path
from urllib.parse import urlsplit

from control.fleet import fleet

NODES = Path(".sandbox/fleet/nodes.json")
if not NODES.exists():
    raise SystemExit("glm-flash: the fleet sandbox is not up. Fix: make fleet-up N=3, then run this again")
# A dict, not a list: pyinfra takes every top-level list of an inventory for a group.
nodes = dict(enumerate(json.loads(NODES.read_text())))
# How many of node2.. are workers (all by default); the fleet bench compares one with several.
WORKERS = int(os.environ.get("GLM_FLASH_FLEET_WORKERS", len(nodes) - 1))
if len(nodes) < 2:
    raise SystemExit("glm-flash: the fleet sandbox needs a gateway and a worker. Fix: make fleet-up N=3")


def ssh(node: dict) -> dict:
    return {
        "ssh_hostname": node["address"],
        "ssh_port": node["port"],
        "ssh_user": "root",
        "ssh_key": ".sandbox/keys/id_ed25519",
        "ssh_known_hosts_file": ".sandbox/fleet/known_hosts",
        "ssh_strict_host_key_checking": "yes",
    }


# The fleet's own stand-ins (started by fleet up on its subnet): the hub (sandbox/fake_hub.py, serving
# the single sandbox's staged checkpoint), from which the fleet's seed downloads the stand-in
# checkpoint (the other workers receive it from the seed), and on a fleet booted from the snapshot
# the NVIDIA repository as the snapshot holds it.
HUB_INFO, STANDINS = Path(".sandbox/hub/hub.json"), Path(".sandbox/fleet/standins.json")
if not HUB_INFO.exists() or not STANDINS.exists():
    raise SystemExit("glm-flash: the fleet's stand-in hub is not up. Fix: make fleet-down, then make fleet-up N=3")
hub, standins = json.loads(HUB_INFO.read_text()), json.loads(STANDINS.read_text())

shared = {
    "require_gpu": False,
    "model_download": True,
    "model_path": "/srv/models/GLM-5.3-Flash",
    "model_id": hub["repo"],
    "model_revision": hub["commit"],
    "hf_endpoint": standins["hub"],
    "allow_reboot": False,
    # The engine's CPython 3.11 comes from the control machine (pyenv on these machines).
    "python_source": os.environ.get("GLM_FLASH_PYTHON_SOURCE", "/root/.pyenv/versions/3.11.7"),
}
if Path(".sandbox/fleet/from-sandbox").exists():
    # `make fleet-up FROM_SANDBOX=1`: the workers are overlays of the deployed single sandbox's snapshot, so they get
    # its settings (the stand-in NVIDIA repository, the staged model): the full node deploy converges there.
    (_, single), *_ = runpy.run_path("inventory/sandbox.py")["hosts"]
    # Not how it is reached: its ssh_ keys and pyinfra's own (_sudo; the fleet's machines log in as root).
    shared.update({k: v for k, v in single.items() if not k.startswith(("ssh_", "_")) and k != "hf_endpoint"})
    for key in ("nvidia_repo_url", "cuda_runfile_url"):  # the same paths, on the fleet's own stand-in
        shared[key] = standins["nvidia"] + urlsplit(shared[key]).path

workers, gateway = fleet(
    shared=shared,
    # Each worker's engine listens on its own loopback address (the containers share the network).
    workers=[(n["name"], {**ssh(n), "listen_host": n["address"]}) for i, n in nodes.items() if 1 <= i <= WORKERS],
    gateway=(
        nodes[0]["name"],
        {
            **ssh(nodes[0]),
            "gateway_listen_host": nodes[0]["address"],
            # The router listens on 127.0.0.1, which the machines share with this one: a port of this checkout's.
            "gateway_router_port": json.loads(Path(".sandbox/ports.json").read_text())["gateway_router"],
            # A few test requests, not production load: balance as soon as one worker has more.
            "gateway_balance_abs_threshold": 1,
            "gateway_balance_rel_threshold": 1.0,
            "gateway_health_interval_s": 2,
            # The tests' clients all come from this machine's one address: a roll's three clients send
            # about 30 requests a second; tests/fleet/test_gateway_fleet.py sends more to see the 429s.
            "gateway_requests_per_s": 60,
            # Requests fail fast on a stopped stand-in: let a restarted one back within seconds, not a minute.
            "gateway_breaker_open_s": 5,
        },
    ),
)
