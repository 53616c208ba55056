"""Deploys killed for real at the points where a half-done run hurts, then re-run, then nothing.

Not simulated: the kill. pyinfra is SIGKILLed with its SSH connections (tests/sandbox/killpoints.py)
at the start of, or midway through, a named operation of a deploy that has work to do:
- after a config upload, before the restart: the restart must still happen in the next run,
  decided from what the running service was started with (#10 item 2);
- midway through the checkpoint download (a shard deleted first, so the hub is asked again);
- right after the engine switch to another engine set. Killed while that set's environment is
  built: tests/sandbox/test_engine_upgrade.py, on the one post4 build a run makes (the build runs
  on in its job unit, the next run attaches to it and switches, the one after changes nothing).
After each kill: one deploy finishes, the next changes nothing, the service was (re)started
after the files it reads changed. No GPU here: "started" is the start attempt the unit makes
(its preflight then refuses, as tests/sandbox/test_unit_hardening.py shows).
"""

from __future__ import annotations

import json
import shlex
import time

import pytest

from sandbox.fake_hub import FakeHub, read_dir
from tests.conftest import (
    REPO,
    SANDBOX_INVENTORY,
    changed_operations,
    inventory_hosts,
    pyinfra,
    sandbox_sh,
    service_last_start,
)
from tests.sandbox.killpoints import deploy_killed_at

pytestmark = pytest.mark.sandbox
RESTART = "glm-flash.service started from the files on disk"


def deploy(*data: str) -> list[str]:
    args = ["--json"]
    for d in data:
        args += ["--data", d]
    run = pyinfra(*args, SANDBOX_INVENTORY, "deploy.py")
    assert run.returncode == 0, run.stderr[-6000:]
    return changed_operations(run.stdout)


def mtime(path: str) -> float:
    return float(sandbox_sh(f"stat -c %.Y {shlex.quote(path)}").stdout)


@pytest.fixture(scope="module")
def converged(sandbox):
    if deploy():
        assert deploy() == [], "the deploy converges before the kill points"
    sandbox_sh("systemctl stop glm-flash.service")  # no retry of an earlier start pending
    return True


def rerun_then_nothing(*data: str) -> list[str]:
    finishing = deploy(*data)
    assert deploy(*data) == [], "the run after the finishing one changes nothing"
    return finishing


def test_killed_after_a_config_upload_before_the_restart(converged):
    data = ("served_model_name=glm-kill-point",)
    started = deploy_killed_at(RESTART, 0.0, *data)
    assert "Launch flags" in started  # the new flags went up in the killed run
    finishing = deploy(*data)
    assert RESTART in finishing and "Launch flags" not in finishing
    assert service_last_start()[0] >= mtime("/etc/glm-flash/launch.json")
    assert deploy(*data) == []
    # back to the inventory's own name, for the tests after these
    assert RESTART in deploy()
    assert deploy() == []


def test_killed_midway_through_the_checkpoint_download(converged):
    """Killed while the download (started in the background early in the run) is inside a shard.
    Simulated: a slow hub (the sandbox hub's files, same commit, from a stand-in in this test
    sending 2 bytes/s in 1-byte writes), so the kill lands mid-file, shown by the bytes served.
    The unit outlives the killed run; the next run starts no second download (each shard is
    asked for once), waits for that one with its progress lines, and finishes; then nothing."""
    (name, data), *_ = inventory_hosts(SANDBOX_INVENTORY)
    if not data.get("model_download"):
        pytest.skip("not applicable: the sandbox inventory stages the checkpoint")
    path = shlex.quote(data["model_path"])
    info = json.loads((REPO / ".sandbox" / "hub" / "hub.json").read_text())
    files = read_dir(REPO / ".sandbox" / "hub" / "repo")
    shards = sorted(n for n in files if n.endswith(".safetensors"))
    assert shards, "the stand-in checkpoint has shards"
    sandbox_sh("rm -f " + " ".join(f"{path}/{shlex.quote(s)}" for s in shards))
    with FakeHub(info["repo"], files, commit=info["commit"], rate=2.0) as slow:
        slow_data = (f"hf_endpoint={slow.endpoint}", "download_progress_s=1")

        def inside_a_shard() -> None:
            """Until the slow hub has sent a shard's first byte (the unit's start, its imports and the
            metadata asks come first: a fixed delay after the operation's line missed them once)."""
            deadline = time.monotonic() + 600
            while not any(slow.served.get(n, 0) for n in shards):
                assert time.monotonic() < deadline, f"no shard was asked for in 600 s: {slow.requests}"
                time.sleep(0.2)

        deploy_killed_at("Download of ", 1.0, *slow_data, until=inside_a_shard)
        assert sandbox_sh("systemctl is-active glm-flash-model-download.service", check=False).stdout.strip() == (
            "active"
        ), "the kill did not land while the download ran"
        partial = {n: slow.served.get(n, 0) for n in shards}
        assert any(0 < b < len(files[n]) for n, b in partial.items()), f"not mid-file: {partial}"
        run = pyinfra(*[a for d in slow_data for a in ("--data", d)], SANDBOX_INVENTORY, "deploy.py")
        assert run.returncode == 0, run.stderr[-6000:]
        gets = [p.rsplit("/", 1)[1] for m, p, _ in slow.requests if m == "GET" and "/resolve/" in p]
    assert sorted(gets) == shards, f"a second download was started: {gets}"
    out = run.stdout + run.stderr
    assert "runs already (glm-flash-model-download)" in out or "following glm-flash-model-download" in out, out[-4000:]
    assert "glm-flash-job: glm-flash-model-download.service succeeded" in out, out[-4000:]
    for shard in shards:
        sandbox_sh(f"test -f {path}/{shlex.quote(shard)}")
    assert deploy() == [], "the run after the finishing one changes nothing"
    # no download unit left behind, and the token (none here) nowhere
    assert sandbox_sh("systemctl is-active glm-flash-model-download.service", check=False).stdout.strip() != "active"


OTHER_SET = "0.7.0.post4"


def other_set_envs() -> list[str]:
    return [e for e in sandbox_sh("ls /opt/glm-flash/engine/envs").stdout.split() if e.startswith(f"{OTHER_SET}-")]


@pytest.fixture(scope="module")
def other_set_built(converged):
    """The other set's environment beside the inventory's: left by tests/sandbox/test_engine_upgrade.py
    when it ran first, otherwise built here the same way (a deploy with that set, then back to the
    inventory's set, which keeps it as `previous`). Never a skip: the kill points below always run."""
    if not other_set_envs():
        try:
            assert any(op.startswith(f"Engine environment {OTHER_SET}-") for op in deploy(f"engine_set={OTHER_SET}"))
        finally:
            deploy()  # back to the inventory's engine set, also when the above failed
        assert deploy() == []
    assert other_set_envs(), f"no {OTHER_SET} environment after deploying it"
    assert "0.7.0.post1-" in sandbox_sh("readlink /opt/glm-flash/engine/current").stdout
    return True


@pytest.mark.parametrize("delay", [0.0, 20.0])
def test_killed_at_the_engine_switch_of_another_set(other_set_built, delay):
    """delay 0: killed as the switch begins; 20 s: long after it (the environment was built beside
    in an earlier run, and `current` moved)."""
    other = f"engine_set={OTHER_SET}"
    try:
        deploy_killed_at("Switch engine current", delay, other)
        deploy(other)
        current = sandbox_sh("readlink /opt/glm-flash/engine/current").stdout.strip()
        assert "0.7.0.post4-" in current
        assert service_last_start()[0] >= mtime("/opt/glm-flash/engine/current")
        assert deploy(other) == []
    finally:
        # back to the inventory's engine set, also when the above failed: the tests after these expect it
        deploy()
    assert deploy() == []
    assert "0.7.0.post1-" in sandbox_sh("readlink /opt/glm-flash/engine/current").stdout
