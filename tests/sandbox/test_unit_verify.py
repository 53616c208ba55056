"""Rendered units pass the target's own `systemd-analyze verify` (trixie's systemd 257);
any output at all (a warning) fails, since verify exits 0 on warnings."""

from __future__ import annotations

import subprocess

import pytest

from control.profile import build
from tests.conftest import REPO
from tests.unit.test_render import unit

VARIANTS = {
    "l40s-default": (build("gpu1", {}), False),
    "l40s-api-key-one-gpu": (build("gpu1", {"tp_size": 1, "pytorch_alloc_conf": "expandable_segments:True"}), True),
}


@pytest.mark.sandbox
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_unit_verifies_on_debian_13(sandbox, variant):
    profile, api_key = VARIANTS[variant]
    text = unit(profile, api_key)
    script = (
        "set -e; d=$(mktemp -d); cat > $d/glm-flash.service;systemd-analyze verify $d/glm-flash.service 2>&1; rm -rf $d"
    )
    run = subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/ssh_config"), "sandbox", script],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and run.stdout.strip() == "", run.stdout + run.stderr
