"""Before anything long starts: does the box have the disk, cores, CPU features and memory?

Runs first in deploy.py, as an operation that reads the box at run time and, on a shortfall,
fails only that host (pyinfra_ext/refusal.py) with one message listing every shortfall,
before any change. The thresholds are knobs (control/defaults.py, preflight_*).
"""

from __future__ import annotations

from control.profile import Profile
from roles.operations.preflight import check


def apply(profile: Profile) -> None:
    check(name="Preflight: disk, cores, CPU features and memory for this profile", profile=profile)
