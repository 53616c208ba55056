"""The transient units the deploy starts, sandboxed, on Debian 13's real systemd 257.

`systemd-analyze security UNIT` rates each while it runs, with the properties the deploy gives
it (roles/operations/sandboxing.py, through the same functions the roles call):

- a root engine build (glm-flash-job): at most 5. The build here is real: glm-flash-engine
  builds an environment of one pin from the deployed wheelhouse with uv, under the sandbox
  (the deploy's own engine build ran under it too). Inside, no network and a read-only system.
- the download's unit and the receive's transient unit (the downloader's user): at most 3. The
  rating is taken of the unit running `sleep`, as the deploy makes it (the properties decide the
  rating, not the command); a real download from the stand-in hub (sandbox/fake_hub.py,
  simulated: the hub) into a scratch directory then runs under the same unit file and verifies.
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from control import layout
from control.profile import build
from roles import model
from roles.operations import checkpoint, sandboxing
from roles.operations.job import job_command
from tests.conftest import SANDBOX_INVENTORY, inventory_hosts, sandbox_sh

pytestmark = pytest.mark.sandbox
sh = sandbox_sh
ROOT_JOB_MAX = 5.0
FETCH_UNIT_MAX = 3.0


@pytest.fixture(scope="module")
def profile():
    name, data = inventory_hosts(SANDBOX_INVENTORY)[0]
    return build(name, data, api_key_present=False)


def exposure(unit: str) -> float:
    out = sh(f"systemd-analyze security --no-pager {unit}").stdout
    m = re.search(rf"Overall exposure level for {re.escape(unit)}: (\d+\.\d+)", out)
    assert m, out[-2000:]
    return float(m.group(1))


def wait_active(unit: str) -> None:
    sh(f"for i in $(seq 300); do systemctl is-active -q {unit} && break; sleep 0.1; done; systemctl is-active {unit}")


@pytest.fixture
def build_job(profile):
    """A one-pin environment built by glm-flash-engine in a glm-flash-job unit, exactly as the
    deploy's engine build (roles/engines/kt/engine.py) but for its lock; removed afterwards."""
    root = layout.engine_root(profile)
    env, name = "sandboxing-test-000000000000", "sandboxing-test"
    lock = f"{root}/locks/{env}.json"
    deployed = json.loads(sh(f"cat $(ls {root}/locks/*.json | grep -v {env} | head -n1)").stdout)
    pin = next(p for p in deployed["pins"] if p["name"] in ("idna", "sniffio", "six", "packaging"))
    sh(f"printf %s {shlex.quote(json.dumps({'pins': [pin]}))} > {lock}")
    python = sh(f"ls {profile.install_root}/python/*/bin/python3.[0-9]* | grep -E 'python3\\.[0-9]+$' | head -n1")
    argv = [layout.tool(profile, "glm-flash-engine"), "build", env, "--python", python.stdout.strip()]
    argv += ["--uv", layout.host_uv(profile)]
    argv += ["--lock", lock, "--wheelhouse", f"{root}/wheelhouse"]
    cmd = job_command(layout.tool(profile, "glm-flash-job"), name, argv, properties=sandboxing.root_job([root]))
    unit = f"glm-flash-job-{name}.service"
    yield unit, cmd.get_raw_value(), f"{root}/envs/{env}"
    sh(f"systemctl stop {unit}; systemctl reset-failed {unit}; rm -rf {root}/envs/{env} {lock}; true")


def test_root_build_job_is_rated_at_most_5_and_builds(sandbox, build_job):
    unit, cmd, env_dir = build_job
    sh(f"nohup sh -c {shlex.quote(cmd + ' > /root/sandboxing-test.log 2>&1')} >/dev/null 2>&1 &")
    wait_active(unit)
    level = exposure(unit)
    sh("for i in $(seq 600); do pgrep -f 'glm-flash-job run sandboxing-tes[t]' >/dev/null || break; sleep 0.2; done")
    log = sh("cat /root/sandboxing-test.log; rm -f /root/sandboxing-test.log").stdout
    assert level <= ROOT_JOB_MAX, f"systemd-analyze security rates {unit} {level} (goal: <= {ROOT_JOB_MAX})"
    assert "complete" in log and sh(f"test -f {env_dir}/.glm-flash-complete", check=False).returncode == 0, log
    assert sh(f"systemctl show -p Result --value {unit}").stdout.strip() == "success"


def test_root_build_job_has_no_network_and_a_read_only_system(sandbox, profile):
    name = "sandboxing-probe"
    probe = (
        "touch /etc/glm-flash-probe 2>/dev/null && echo etc-writable; "
        "touch /tmp/probe && echo tmp-writable; "
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 22), timeout=3)' 2>/dev/null "
        "&& echo network-reached; "
        f"touch {layout.engine_root(profile)}/.probe && echo engine-writable; rm -f {layout.engine_root(profile)}/.probe"
    )
    props = sandboxing.root_job([layout.engine_root(profile)])
    cmd = job_command(layout.tool(profile, "glm-flash-job"), name, ["sh", "-c", probe], properties=props)
    try:
        out = sh(cmd.get_raw_value()).stdout
    finally:
        sh(f"systemctl stop glm-flash-job-{name}; systemctl reset-failed glm-flash-job-{name}; true")
    assert "tmp-writable" in out and "engine-writable" in out, out
    assert "etc-writable" not in out and "network-reached" not in out, out


def download_unit_started(unit: str, user: str, command: list[str], dest: str, endpoint: str, token) -> None:
    """The download's unit file as the deploy writes it (checkpoint.download_unit_text), started."""
    text = checkpoint.download_unit_text(user, command, dest, endpoint, token, "a test")
    sh(f"printf %s {shlex.quote(text)} > {checkpoint.download_unit_path(unit)} && systemctl daemon-reload")
    sh(f"systemctl start {unit}")


def removed(unit: str) -> str:
    return (
        f"systemctl stop {unit}; systemctl reset-failed {unit}; rm -f {checkpoint.download_unit_path(unit)} "
        f"{layout.SECRETS_DIR}/hf-token-{unit}; systemctl daemon-reload; true"
    )


@pytest.mark.parametrize("kind", ["download", "receive"])
def test_fetch_units_are_rated_at_most_3(sandbox, profile, kind):
    """Each as the deploy makes it (the download a unit file with its token credential, the receive
    a transient unit), running sleep."""
    unit = f"glm-flash-hardening-{kind}"
    user = model.fetch_user(profile)
    try:
        if kind == "download":
            token = f"{layout.SECRETS_DIR}/hf-token-{unit}"
            sh(f"install -d -m 700 {layout.SECRETS_DIR} && umask 077 && printf x > {token}")
            download_unit_started(unit, user, ["/usr/bin/sleep", "300"], "/var/tmp", profile.hf_endpoint, token)
        else:
            cmd = checkpoint.download_unit_command(unit, user, "/usr/bin/sleep", "300", [], "/var/tmp", "", None)
            sh(f"nohup sh -c {shlex.quote(cmd.get_raw_value())} >/dev/null 2>&1 &")
        wait_active(unit)
        level = exposure(f"{unit}.service")
    finally:
        sh(removed(unit))
    assert level <= FETCH_UNIT_MAX, f"systemd-analyze security rates {unit} {level} (goal: <= {FETCH_UNIT_MAX})"


def test_a_real_download_runs_under_the_fetch_sandbox(sandbox, profile):
    """The download's unit file with the real downloader, followed by `glm-flash-job follow` as the
    deploy follows it."""
    user, dest = model.fetch_user(profile), "/srv/sandboxing-test/model"
    unit = "glm-flash-hardening-real"
    commit = model.commit_for(profile.model_id, profile.model_revision)
    tool = layout.tool(profile, "glm-flash-model-fetch")
    args = ["download", "--dest", dest, "--repo", profile.model_id, "--revision", commit]
    sh(
        f"rm -rf /srv/sandboxing-test && install -d -m 755 /srv/sandboxing-test && install -d -o {user} -g {user} {dest}"
    )
    try:
        download_unit_started(
            unit, user, [f"{layout.hub_venv(profile)}/bin/python", tool, *args], dest, profile.hf_endpoint, None
        )
        r = sh(f"{layout.tool(profile, 'glm-flash-job')} follow {unit}.service", False)
        assert r.returncode == 0, r.stdout + r.stderr
        check = sh(f"python3 {tool} check --dest {dest} --repo {profile.model_id} --revision {commit}", check=False)
        assert check.returncode == 0 and json.loads(check.stdout)["state"] == "complete", check.stdout
        assert sh(f"systemctl show -p Result -p NRestarts --value {unit}").stdout.split() == ["success", "0"]
    finally:
        sh(removed(unit) + "; rm -rf /srv/sandboxing-test")
