"""The fleet's transfer steps only: artifacts (roles/fleet/artifacts.py) and the checkpoint (roles/model.py).

The artifacts are the gateway's wheels (36 MB): the engine's 5 GB would not fit three times on the
test machine. The mechanism, the paths under install_root and the checks are those of a full
fleet deploy. The checkpoint is the real model role against the fleet's stand-in hub, serving the
single sandbox's stand-in checkpoint (inventory/fleet_sandbox.py): the seed downloads it, the others receive it from every worker that
holds it verified. GLM_FLASH_FLEET_WORKERS (inventory/fleet_sandbox.py) picks how many workers.
"""

from pathlib import Path

from control import profile
from roles import model
from roles.fleet import artifacts as fleet_artifacts
from roles.fleet import checkpoint as fleet_checkpoint
from roles.fleet import gateway

p = profile.for_current_host()
# the gateway's wheels for the workers' python3 (Debian 13's, x86_64), as its deploy chooses them
DEBIAN_13 = {
    "implementation": "cpython",
    "version": "3.13",
    "platform": "linux-x86_64",
    "libc": "glibc 2.41",
    "bits": 64,
}
wheels = map(Path, gateway.wheels_for(DEBIAN_13))
entries = [fleet_artifacts.entry(w, "644", f"fleet-test/wheelhouse/{w.name}") for w in wheels]
fleet_artifacts.apply(p, entries)
fleet_checkpoint.share()  # as deploy_fleet.py does
model.apply(p)
model.ready(p)  # the download started above, waited for (the workers that lack it receive it)
