"""Deploy a fleet (inventory/fleet.py): the gateway host gets the router, every worker the node
(its artifacts cross the control machine's link once: roles/fleet/artifacts.py).

    pyinfra inventory/fleet.py deploy_fleet.py

The inventory has already refused a fleet whose workers would serve different things.
"""

from pyinfra import host, local

from control import profile
from control.fleet import GATEWAY, gateway_for_current_host
from pyinfra_ext import host_failures, op_order
from roles.fleet import artifacts as fleet_artifacts
from roles.fleet import checkpoint as fleet_checkpoint
from roles.fleet import gateway
from roles.fleet import roll as fleet_roll

# As deploy.py (included below) does, before the fleet's own operations are defined.
op_order.install()  # pyinfra's operation order without reading source text (pyinfra_ext/op_order.py)
host_failures.install()  # a host that goes away mid-run fails alone; the others go on

if GATEWAY in host.groups:
    gateway.apply(gateway_for_current_host())
else:
    p = profile.for_current_host()
    # The interpreter and the engine's wheels: from the control machine to one worker, from it to the others.
    fleet_artifacts.apply(p, fleet_artifacts.engine_entries(p))
    # The checkpoint: one worker downloads, the others receive from it (when deploy.py's model role needs it).
    fleet_checkpoint.share()
    # The engines' restarts: roll_batch workers at a time, each out of the gateway meanwhile.
    fleet_roll.register(p)
    local.include("deploy.py")
