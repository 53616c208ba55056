"""A pyinfra deploy for tests/fleet/test_fleet_roll_deploy.py: the engine's restart operation as
roles/service.py defines it on a fleet with a gateway (started_from_disk with the run's Roll and
`_parallel=roll_batch`), on the fleet sandbox's workers, whose glm-flash.service there is a
stand-in engine (tests/bench/fake_openai.py) and whose one input is /etc/glm-flash-standin/stamp.

    pyinfra -y inventory/fleet_sandbox.py tests/fleet/roll_deploy.py --limit workers
"""

from pyinfra import host

from control import profile, run_record
from control.fleet import GATEWAY
from pyinfra_ext import host_failures, op_order
from roles.fleet import roll as fleet_roll
from roles.operations.service_restart import started_from_disk

op_order.install()
host_failures.install()

if GATEWAY not in host.groups:
    p = profile.for_current_host()
    fleet_roll.register(p)
    roll = run_record.current().engine_roll
    started_from_disk(
        name="stand-in engine started from the files on disk (rolling, behind the gateway)",
        service="glm-flash.service",
        inputs=["/etc/glm-flash-standin/stamp"],
        roll=roll,
        _parallel=roll.parallel(),
    )
