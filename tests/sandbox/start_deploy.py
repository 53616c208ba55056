"""The deploy's start of glm-flash.service on a GPU host (tests/sandbox/test_readiness.py).

deploy.py reaches this operation through roles/service.py with can_serve=bool(GPUs); the
sandbox has none, so the test runs the same operation, with the same arguments but
can_serve=True, alone: its output is what a GPU host's deploy prints while readiness waits.
"""

from control import profile
from roles import service
from roles.operations.service_restart import started_from_disk

started_from_disk(
    name="glm-flash.service started from the files on disk",
    service="glm-flash.service",
    inputs=service.start_inputs(profile.for_current_host()),
    units=["glm-flash.service", "glm-flash-gpu.service"],
    can_serve=True,
)
