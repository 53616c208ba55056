"""Only the fleet's artifact step (roles/fleet_artifacts.py), with the gateway's wheels (36 MB) as
the artifacts: the engine's 5 GB would not fit three times on the test machine. The mechanism,
the paths under install_root and the checks are those of a full fleet deploy.

A second set, "checkpoint", is made on the seed by an operation (as a model role's download from
the hub would) and has no copy on the control machine: the peers get it from the seed only.
"""

import hashlib

from pyinfra import host, inventory, state
from pyinfra.operations import server

from control import profile
from control.fleet import WORKERS
from roles import fleet_artifacts, gateway
from tests.fleet.checkpoint_standin import CHECKPOINT, COMMAND, SHARD, SIZE, shard

p = profile.for_current_host()
entries = [fleet_artifacts.entry(w, "644", f"fleet-test/wheelhouse/{w.name}") for w in gateway.wheels(p)]
fleet_artifacts.apply(p, entries)

checkpoint = [fleet_artifacts.Entry(None, hashlib.sha256(shard()).hexdigest(), SIZE, "644", SHARD)]
seed = [h for h in inventory.get_group(WORKERS) if h in state.active_hosts][0]
if host == seed and fleet_artifacts.lacking(host, CHECKPOINT, checkpoint):
    server.shell(
        name="Stand-in for the seed's download from the hub",
        commands=[f"mkdir -p {CHECKPOINT} && {COMMAND} > {CHECKPOINT}/{SHARD}"],
    )
fleet_artifacts.apply(p, checkpoint, name="checkpoint", root=CHECKPOINT)
