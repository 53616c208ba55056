"""Only the fleet's artifact step (roles/fleet_artifacts.py), with the gateway's wheels (36 MB) as
the artifacts: the engine's 5 GB would not fit three times on the test machine. The mechanism,
the paths under install_root and the checks are those of a full fleet deploy."""

from control import profile
from roles import fleet_artifacts, gateway

p = profile.for_current_host()
entries = [fleet_artifacts.entry(w, "644", f"fleet-test/wheelhouse/{w.name}") for w in gateway.wheels(p)]
fleet_artifacts.apply(p, entries)
