"""A killed deploy cannot leave the old service running: the restart is decided from the
host's state (roles/operations/service_restart.py), not from what changed in this run.

Simulated: the killed run. Each case writes on the sandbox exactly what a run killed between
its upload (or the engine switch) and the restart leaves: the file the deploy wants, with
the content it wants and a new mtime, and no restart. The next deploy then has nothing to
upload, so only the host's state can tell. No GPU here, so the service cannot stay up (its
preflight refuses, tests/host/test_service.py); what is observed is a start attempted after
the change: its InactiveExitTimestamp (the start job leaving inactive) and InvocationID.
"""

from __future__ import annotations

import pytest

from tests.conftest import SANDBOX_INVENTORY, changed_operations, pyinfra, sandbox_sh, service_last_start

pytestmark = pytest.mark.sandbox
OP = "glm-flash.service started from the files on disk"
CURRENT = "/opt/glm-flash/engine/current"  # install_root of inventory/sandbox.py

KILLED_AFTER = {
    # the launch flags were uploaded (same bytes as this deploy's), then the run died
    "config upload": "cp -p /etc/glm-flash/launch.json /tmp/l && cat /tmp/l > /etc/glm-flash/launch.json",
    "environment upload": "cp /etc/glm-flash/glm-flash.env /tmp/e && cat /tmp/e > /etc/glm-flash/glm-flash.env",
    # `glm-flash-engine switch`: a new link renamed over `current`
    "engine switch": f"ln -sfn $(readlink {CURRENT}) {CURRENT}.new && mv -T {CURRENT}.new {CURRENT}",
    # the unit was rewritten, systemd never reloaded it
    "unit upload": "cp /etc/systemd/system/glm-flash.service /tmp/u && "
    "cat /tmp/u > /etc/systemd/system/glm-flash.service",
}


def deploy() -> list[str]:
    run = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")
    assert run.returncode == 0, run.stderr[-6000:]
    return changed_operations(run.stdout)


@pytest.fixture(scope="module")
def converged(sandbox):
    if deploy():
        assert deploy() == [], "the deploy converges before the kill cases"
    return True


@pytest.mark.parametrize("case", list(KILLED_AFTER))
def test_next_deploy_restarts_onto_what_is_on_disk(converged, case):
    # Earlier tests start it by hand (tests/host/test_service.py); Restart=on-failure would retry
    # such a start 30 s later: stopping cancels a pending retry, so only the deploy starts it below.
    sandbox_sh("systemctl stop glm-flash.service")
    before, inv_before = service_last_start()
    sandbox_sh(KILLED_AFTER[case])
    changed_at = float(sandbox_sh("date +%s.%N").stdout)
    assert deploy() == [OP], f"after a run killed after the {case}, only the restart is due"
    after, inv_after = service_last_start()
    assert after > changed_at > before and inv_after != inv_before
    # tried once: no automatic retry left pending to move the state under the next run
    assert sandbox_sh("systemctl is-active glm-flash.service", check=False).stdout.strip() in ("failed", "inactive")
    assert deploy() == [], "then nothing"
