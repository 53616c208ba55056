"""Root never runs what a build step left in the engine environment (issue 36 item 5, M3).

A build step (an sdist's setup.py, the fork's cmake) runs in the build's sandbox but writes the
new environment; a `.pth` it drops there runs at every start of that environment's python. The
two things root did with the new environment afterwards, the launch-flag check and `assert-pin`,
are run here exactly as the deploy renders them, with such a canary planted in the serving
environment: it must run (the test sees its line) and must never run as full root: the flag check
as the service user, the pin put back in the build's sandbox (no capabilities, the system
read-only), neither able to write outside its own output.
"""

from __future__ import annotations

import json
import shlex

import pytest

from control import layout, profile
from roles.engines.kt import launch
from roles.facts.engine import LaunchFlagCheck
from roles.operations import sandboxing
from roles.operations.job import job_command
from tests.conftest import sandbox_sh

pytestmark = pytest.mark.sandbox

PROFILE = profile.build("sandbox", {"engine_set": "0.7.0.post1"})
CANARY_FILE = "/var/lib/glm-flash-canary"  # where a canary running as root would leave its mark
# It says what it is on stderr, and also in RUNS beside it when it may write there: an installer
# that runs the environment's python to read it (uv reads the interpreter's answer, and keeps its
# output to itself unless the answer is unreadable) swallows the line, not the file.
RUNS = "glm-flash-canary.runs"
CANARY = f"""import os, sys
caps = next(line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff:"))
said = [f"canary: uid {{os.getuid()}} CapEff {{caps}}"]
try:
    with open({CANARY_FILE!r}, "a") as f:
        f.write(f"{{os.getuid()}} {{caps}}\\n")
except OSError as e:
    said.append(f"canary: cannot write {CANARY_FILE}: {{e.strerror}}")
sys.stderr.write("".join(line + "\\n" for line in said))
try:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), {RUNS!r}), "a") as f:
        f.write("".join(line + "\\n" for line in said))
except OSError:
    pass
"""


@pytest.fixture(scope="module")
def canary(sandbox):
    """The canary in the serving environment's site-packages, as a build step would leave it."""
    env = sandbox_sh(f"readlink -f {layout.engine_root(PROFILE)}/current").stdout.strip()
    site = sandbox_sh(f"ls -d {shlex.quote(env)}/lib/python3.*/site-packages").stdout.strip()
    module, pth, runs = f"{site}/glm_flash_canary.py", f"{site}/glm-flash-canary.pth", f"{site}/{RUNS}"
    sandbox_sh(
        f"rm -f {CANARY_FILE} {shlex.quote(runs)}; printf %s {shlex.quote(CANARY)} > {shlex.quote(module)}; "
        f"echo 'import glm_flash_canary' > {shlex.quote(pth)}"
    )
    try:
        yield env
    finally:
        sandbox_sh(f"rm -f {shlex.quote(module)} {shlex.quote(pth)} {shlex.quote(runs)} {CANARY_FILE}")


def ran_as(output: str) -> list[tuple[int, str]]:
    """(uid, CapEff) of each run of the canary, from its lines."""
    return [(int(w[2]), w[4]) for w in (line.split() for line in output.splitlines()) if w[:2] == ["canary:", "uid"]]


def mark() -> str:
    return sandbox_sh(f"cat {CANARY_FILE} 2>/dev/null || true").stdout


def test_the_flag_check_imports_the_new_environment_as_the_service_user_only(canary):
    spec = launch.launch_spec(PROFILE, 2)
    check = {k: spec[k] for k in ("module", "args", "api_key_flag") if k in spec}
    records = "/root/glm-flash-canary-flag-checks"  # a record directory of its own: the check must run
    command = LaunchFlagCheck().command(
        python=f"{canary}/bin/python",
        tool=layout.tool(PROFILE, "glm-flash-check-flags"),
        spec_json=json.dumps(check, sort_keys=True),
        properties=tuple(sandboxing.engine_check(PROFILE.service_user)),
        record_dir=records,
    )
    try:
        r = sandbox_sh(command.get_raw_value(), check=False)
        out = r.stdout + r.stderr
        uid = int(sandbox_sh(f"id -u {PROFILE.service_user}").stdout)
        assert "exit=0" in out and "accepted by sglang.launch_server" in out, out[-3000:]
        assert ran_as(out), f"the canary did not run at all:\n{out[-3000:]}"  # else this test proves nothing
        assert set(ran_as(out)) == {(uid, "0000000000000000")}, out[-3000:]
        assert f"canary: cannot write {CANARY_FILE}" in out
        assert mark() == "", f"the canary wrote as root: {mark()}"
        # root recorded the acceptance it read: the next check answers without importing the engine
        again = sandbox_sh(command.get_raw_value(), check=False)
        assert "(recorded " in again.stdout and not ran_as(again.stdout + again.stderr), again.stdout
    finally:
        sandbox_sh(f"rm -rf {records}")


def test_assert_pin_runs_the_environments_installer_in_the_builds_sandbox(canary):
    env = canary.rsplit("/", 1)[1]
    tool = layout.tool(PROFILE, "glm-flash-engine")
    pins = {
        p["name"] for p in json.loads(sandbox_sh(f"cat {layout.engine_root(PROFILE)}/locks/{env}.json").stdout)["pins"]
    }
    package = "six" if "six" in pins else sorted(pins)[0]  # a small wheel: the reinstall takes seconds
    command = job_command(
        layout.tool(PROFILE, "glm-flash-job"),
        "engine-pin",
        [tool, "assert-pin", env, package, "--force"],
        properties=sandboxing.root_job([canary]),
    )
    r = sandbox_sh(command.get_raw_value(), check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    # what it said, on the job's output or (the installer keeping it) in its file in the environment
    out = (
        r.stdout
        + r.stderr
        + sandbox_sh(f"cat {shlex.quote(canary)}/lib/python3.*/site-packages/{RUNS}", check=False).stdout
    )
    runs = ran_as(out)
    assert runs, f"the canary did not run at all:\n{out[-3000:]}"
    # root's uid, but no capability at all: the build's sandbox, not root's session
    assert {caps for _, caps in runs} == {"0000000000000000"}, out[-3000:]
    assert f"canary: cannot write {CANARY_FILE}" in out
    assert mark() == "", f"the canary wrote outside the environment: {mark()}"
