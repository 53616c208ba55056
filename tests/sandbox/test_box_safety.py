"""A real box's bad moments, on the deployed sandbox (#21 items 7 and 8): a kill while a managed
file goes up, a kill while apt installs, dpkg left half-way, and another process holding dpkg's
lock or apt's lists lock while a deploy waits for it, saying so (what unattended-upgrades and
apt-daily do after a reboot). Each ends with a run that finishes
and one that changes nothing. Cheap: a converged deploy, and `jq` (one small base package) removed
and reinstalled.

Not simulated: the kills (pyinfra SIGKILLed with its SSH connection, tests/sandbox/killpoints.py),
dpkg's state (real `dpkg --unpack` without configure, what a kill between the two leaves) and the
lock (held with fcntl(2) like apt and dpkg take it: a `flock` would not block apt, docs/sources.md §7b).
"""

from __future__ import annotations

import json
import re
import shlex

import pytest

from roles.operations import packages
from tests.conftest import SANDBOX_INVENTORY, changed_operations, pyinfra, sandbox_sh
from tests.sandbox.killpoints import deploy_killed_at
from tests.sandbox.test_unit_hardening import put

pytestmark = pytest.mark.sandbox
LAUNCH = "/etc/glm-flash/launch.json"
UNIT = "/etc/systemd/system/glm-flash.service"
PACKAGE = "jq"  # in base_packages, small, nothing of ours depends on it at run time
RECOVER = "dpkg: nothing left interrupted"
OWNED_DIRS = "/etc/glm-flash /etc/systemd/system /etc/apt /etc/modprobe.d /opt/glm-flash/bin /usr/local/bin"


def deploy(*data: str, output: bool = False) -> tuple[list[str], str]:
    """The changed operations and pyinfra's stderr (with `output`, -vvv: the commands' output too)."""
    args = ["--json", *(["-vvv"] if output else [])]
    for d in data:
        args += ["--data", d]
    run = pyinfra(*args, SANDBOX_INVENTORY, "deploy.py")
    assert run.returncode == 0, run.stderr[-6000:]
    return changed_operations(run.stdout), run.stderr


@pytest.fixture(scope="module")
def converged(sandbox):
    if deploy()[0]:
        assert deploy()[0] == [], "the deploy converges before these tests"
    return True


def leftovers() -> list[str]:
    r = sandbox_sh(f"find {OWNED_DIRS} -name '.*.glm-flash-new' 2>/dev/null; true")
    return r.stdout.split()


def test_a_kill_while_a_managed_file_goes_up_leaves_one_whole_version(converged):
    """Killed as the unit file's upload begins (its op has a unique name; "Launch flags" would also
    match the flag check before it): the unit on disk is the old one or the new one, whole."""
    old = sandbox_sh(f"cat {UNIT}").stdout
    data = "restart_limit=7"
    started = deploy_killed_at("glm-flash.service unit", 0.0, data)
    assert started[-1] == "glm-flash.service unit"
    now = sandbox_sh(f"cat {UNIT}").stdout
    assert now == old or now == old.replace("StartLimitBurst=3", "StartLimitBurst=7").replace(
        "after 3 failed", "after 7 failed"
    ), "the unit is one whole version"
    deploy(data)
    assert "StartLimitBurst=7" in sandbox_sh(f"cat {UNIT}").stdout and leftovers() == []
    assert deploy(data)[0] == []
    deploy()  # back to the inventory's values for the tests after this one
    assert deploy()[0] == [] and sandbox_sh(f"cat {UNIT}").stdout == old


def test_a_half_written_temporary_file_never_reaches_the_destination(converged):
    """What a kill or a full disk midway through the upload leaves: a partial temporary file beside
    the intact destination. The next run replaces the destination whole and removes the leftover."""
    old = sandbox_sh(f"cat {LAUNCH}").stdout
    sandbox_sh(f"head -c 10 {LAUNCH} > /etc/glm-flash/.launch.json.glm-flash-new")
    assert sandbox_sh(f"cat {LAUNCH}").stdout == old
    data = "served_model_name=glm-whole-file"
    assert "Launch flags" in deploy(data)[0]
    now = sandbox_sh(f"cat {LAUNCH}").stdout
    assert "glm-whole-file" in json.dumps(json.loads(now)) and leftovers() == []
    deploy()
    assert deploy()[0] == [] and sandbox_sh(f"cat {LAUNCH}").stdout == old


def remove_package():
    sandbox_sh(f"DEBIAN_FRONTEND=noninteractive apt-get -y remove {PACKAGE}")


def installed() -> bool:
    r = sandbox_sh(f"dpkg-query -W -f='${{db:Status-Abbrev}}' {PACKAGE}", check=False)
    return r.stdout.startswith("ii")


def test_dpkg_left_half_way_is_finished_and_said(converged):
    remove_package()
    sandbox_sh(f"cd /tmp && rm -f {PACKAGE}_*.deb && apt-get download {PACKAGE} && dpkg --unpack /tmp/{PACKAGE}_*.deb")
    assert sandbox_sh("dpkg --audit", check=False).stdout.strip(), "dpkg is left half-way"
    # apt itself refuses or is stuck on such a state; the deploy finishes it first and says so
    changed, stderr = deploy()
    assert any(op.startswith(RECOVER) for op in changed)
    assert "dpkg was left interrupted" in stderr and PACKAGE in stderr
    assert sandbox_sh("dpkg --audit", check=False).stdout.strip() == "" and installed()
    assert deploy()[0] == []


# The power cut or OOM kill that a dropped SSH session alone does not cause (apt and dpkg outlive
# the hang-up: seen in this test's first form, which only killed pyinfra), at a point where dpkg has
# changed the package database: dpkg's own post-invoke hook (dpkg.cfg(5), run through `sh -c` with
# dpkg as its parent) SIGKILLs the dpkg of apt that has just unpacked the package (DPKG_HOOK_ACTION
# unpack; apt runs dpkg with `--status-fd N`), before its configure run: the package is left
# unpacked and not configured. Armed once (the hook removes its arming file), so the deploy's own
# dpkg calls after it (--audit, --configure -a) run untouched. Before, a poller killed the first
# dpkg of apt's it saw, every 5 ms: on a loaded machine it caught dpkg before dpkg had written
# anything, which left nothing half-way and proved nothing.
HOOK = "/etc/dpkg/dpkg.cfg.d/glm-flash-test-kill"
ARMED = "/run/glm-flash-test-dpkg-armed"
KILLED = "/run/glm-flash-test-dpkg-killed"  # what it killed (a file: journald may not attribute a line)
KILL_AFTER_UNPACK = (
    f'post-invoke=if [ "$DPKG_HOOK_ACTION" = unpack ] && rm {ARMED} 2>/dev/null; then '
    f"tr '\\0' ' ' </proc/$PPID/cmdline >{KILLED}; kill -9 $PPID; fi\n"
)


def arm_dpkg_killer():
    sandbox_sh(f"rm -f {KILLED}; touch {ARMED}")
    put(HOOK, KILL_AFTER_UNPACK)


def dpkg_killed():
    """Returns once the hook has killed apt's dpkg (or after 10 minutes), and takes the hook away."""
    sandbox_sh(f"for i in $(seq 6000); do test -s {KILLED} && exit 0; sleep 0.1; done; exit 1", check=False)
    sandbox_sh(f"rm -f {HOOK} {ARMED}")


def test_a_kill_during_an_apt_install_then_a_run_recovers_dpkg_and_finishes(converged):
    """dpkg SIGKILLed mid-install and pyinfra with it: dpkg is left half-way; the next run says so,
    finishes it, installs what was asked; the one after changes nothing."""
    remove_package()
    arm_dpkg_killer()
    started = deploy_killed_at("Base packages", 0.0, until=dpkg_killed)
    assert started[-1] == "Base packages"
    # apt-get sees its dpkg die and exits: wait for it (bounded) before reading dpkg's state
    sandbox_sh("for i in $(seq 300); do pgrep -x apt-get >/dev/null || exit 0; sleep 0.1; done; exit 1", check=False)
    audit = sandbox_sh("dpkg --audit; ls /var/lib/dpkg/updates", check=False).stdout.strip()
    killed = sandbox_sh(f"cat {KILLED}", check=False).stdout
    print(f"after the kill: installed={installed()} dpkg: {audit!r} killed: {killed!r}")
    assert "--status-fd" in killed and "--unpack" in killed, f"the hook killed no unpacking dpkg of apt's: {killed!r}"
    assert audit, "dpkg was left half-way (else the kill missed dpkg and this proves nothing)"
    changed, stderr = deploy()
    assert any(op.startswith(RECOVER) for op in changed) and "dpkg was left interrupted" in stderr
    assert installed() and sandbox_sh("dpkg --audit", check=False).stdout.strip() == ""
    assert deploy()[0] == []


# What unattended-upgrades holds (dpkg's frontend lock) and what apt-daily holds (apt's lists lock),
# taken with fcntl(2) as apt and dpkg take them. The holder lets go only once the process named by
# `waiter` (a pgrep -f pattern) has been there `patience` seconds: it is then blocked on the lock,
# not merely late. It writes what it saw, so a test asserts the wait itself, not a lower bound on the
# deploy's time (a slow run that reached apt after a timed hold ended would pass that without waiting).
HOLDER = """
import fcntl, os, subprocess, sys, time
path, tag, waiter, patience = sys.argv[1], sys.argv[2], os.environ["WAITER"], float(os.environ["PATIENCE"])
f = open(path, "w")
fcntl.lockf(f, fcntl.LOCK_EX)
open(f"/run/glm-flash-test-{tag}-locked", "w").close()
seen, end = None, time.monotonic() + 900
while time.monotonic() < end:
    if waiter and subprocess.run(["pgrep", "-f", waiter], capture_output=True).returncode == 0:
        seen = seen or time.monotonic()
        if time.monotonic() - seen >= patience:
            break
    time.sleep(0.2)
waited = seen is not None and time.monotonic() - seen >= patience
open(f"/run/glm-flash-test-{tag}-waited", "w").write("waited" if waited else "nobody waited")
"""
FRONTEND, LISTS = "/var/lib/dpkg/lock-frontend", "/var/lib/apt/lists/lock"
STAMP = "/var/lib/apt/periodic/update-success-stamp"  # pyinfra's "lists older than a day" reads its mtime
HOLDER_UNIT = "glm-flash-test-apt-lock"  # one unit per lock: HOLDER_UNIT-<tag>


def hold_lock(path: str, tag: str, waiter: str = "", patience: float = 0) -> None:
    """Hold `path` until `waiter` has waited `patience` s for it (no waiter: until stopped by hand),
    in the unit HOLDER_UNIT-<tag>. The pattern reaches the holder in its environment: in its argv,
    pgrep would find the holder itself."""
    unit = f"{HOLDER_UNIT}-{tag}"
    sandbox_sh(
        f"systemctl stop {unit} 2>/dev/null; rm -f /run/glm-flash-test-{tag}-locked /run/glm-flash-test-{tag}-waited; "
        f"printf %s {shlex.quote(HOLDER)} > /run/glm-flash-test-holder.py"
    )
    sandbox_sh(
        f"systemd-run --unit={unit} --collect -E WAITER={shlex.quote(waiter)} -E PATIENCE={patience} "
        f"python3 /run/glm-flash-test-holder.py {path} {tag}"
    )
    sandbox_sh(f"for i in $(seq 50); do [ -e /run/glm-flash-test-{tag}-locked ] && exit 0; sleep 0.1; done; exit 1")


def held_until_waited_for(tag: str) -> str:
    unit = f"{HOLDER_UNIT}-{tag}"
    sandbox_sh(f"for i in $(seq 300); do systemctl is-active -q {unit} || exit 0; sleep 0.1; done; exit 1")
    return sandbox_sh(f"cat /run/glm-flash-test-{tag}-waited", check=False).stdout.strip()


def test_a_deploy_waits_for_dpkgs_lock_then_for_apts_lists_lock(converged):
    remove_package()
    hold_lock(FRONTEND, "dpkg")
    # the holder really blocks apt: without the wait, apt-get fails at once
    r = sandbox_sh(f"DEBIAN_FRONTEND=noninteractive apt-get -y install {PACKAGE}", check=False)
    sandbox_sh(f"systemctl stop {HOLDER_UNIT}-dpkg")
    assert r.returncode != 0 and "lock" in (r.stdout + r.stderr) and not installed()
    # One deploy, both locks held (apt-daily's and unattended-upgrades' at once), the lists a day old:
    # apt's lists lock until the deploy's update has waited 1 s for it (it is tried every 5 s), dpkg's
    # until the install has waited 5 s. The deploy says it waits for each, in that order (its own
    # packages.WAITING line with apt's lock line, then apt's own DPkg::Lock::Timeout line), then installs.
    sandbox_sh(f"touch -d '2 days ago' {STAMP}")
    hold_lock(LISTS, "lists", "until out=..apt-get .*update", 1)
    # 5 s: the holder counts from when pgrep first matches the install's command (its shell, before
    # apt-get has asked for the lock). With 1 s, one cold run on the loaded CI machine had the holder
    # count its second while apt printed no wait: apt most likely found the lock already free.
    hold_lock(FRONTEND, "dpkg", f"apt-get .*install.* {PACKAGE}$", 5)
    changed, out = deploy(output=True)
    assert "Base packages" in changed and installed()
    assert held_until_waited_for("lists") == "waited", "the update did not wait for the lists lock"
    assert held_until_waited_for("dpkg") == "waited", "the install did not wait for dpkg's lock"
    lists_wait = out.find(f"{packages.WAITING} E: Could not get lock {LISTS}")
    dpkg_wait = re.search(rf"Waiting for cache lock: Could not get lock {FRONTEND}\b", out)
    said = "\n".join(line for line in out.splitlines() if "lock" in line.lower())
    assert lists_wait != -1 and dpkg_wait and lists_wait < dpkg_wait.start(), said or out[-6000:]
    assert deploy()[0] == []
