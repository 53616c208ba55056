"""Deploy a fleet (inventory/fleet.py): the gateway host gets the router, every worker the node.

    pyinfra inventory/fleet.py deploy_fleet.py

The inventory has already refused a fleet whose workers would serve different things.
"""

from pyinfra import host, local

from control.fleet import GATEWAY, gateway_for_current_host
from roles import gateway

if GATEWAY in host.groups:
    gateway.apply(gateway_for_current_host())
else:
    local.include("deploy.py")
