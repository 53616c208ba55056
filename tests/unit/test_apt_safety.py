"""apt and dpkg on a box that also maintains itself (roles/operations/packages.py): every apt-get
waits for dpkg's lock (bounded), and dpkg left interrupted by a killed run is finished first."""

from __future__ import annotations

import subprocess

from pyinfra.facts.deb import DebPackages

from roles.facts.apt import DpkgInterrupted
from roles.operations import packages
from tests.unit.fakehost import FakeHost, commands, on

# What `dpkg --audit` prints for a package a kill left unpacked (dpkg 1.22, Debian 13).
AUDIT = [
    "audit The following packages have been unpacked but not yet configured.",
    "audit They must be configured using dpkg --configure or the configure option",
    "audit in dselect's menu for them to work:",
    "audit  sl                   Correct an unfortunate ls typo",
]


def test_the_fact_finds_pending_journal_entries_and_audited_packages():
    assert DpkgInterrupted.parse(["updates 0"]) == []
    assert DpkgInterrupted.parse([]) == []
    assert DpkgInterrupted.parse(["updates 2"]) == ["2 pending journal file(s) in /var/lib/dpkg/updates"]
    reasons = DpkgInterrupted.parse(["updates 0", *AUDIT])
    assert len(reasons) == 1 and reasons[0].startswith("dpkg --audit: The following packages have been unpacked")
    assert "sl" in reasons[0]


def test_clean_dpkg_runs_nothing():
    fake = FakeHost({DpkgInterrupted: []})
    with on(fake):
        assert list(packages._dpkg_recovered._inner()) == []
    assert fake.noops == ["dpkg: nothing left interrupted"]


def test_interrupted_dpkg_is_configured_waiting_for_the_lock():
    cmds = commands(packages._dpkg_recovered, {DpkgInterrupted: ["2 pending journal file(s) in /var/lib/dpkg/updates"]})
    assert cmds == [packages.CONFIGURE_PENDING]
    assert "dpkg --force-confdef --force-confold --configure -a" in cmds[0]


def run_sh(script: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], env={"PATH": path}, capture_output=True, text=True, timeout=60)


def test_the_recovery_retries_while_the_lock_is_held_and_fails_on_anything_else(tmp_path):
    """The loop against a stand-in dpkg: locked twice then done; a real failure ends it at once."""
    count = tmp_path / "n"
    count.write_text("0")
    fake = tmp_path / "dpkg"
    fake.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {count}); echo $((n+1)) > {count}\n"
        'if [ "$n" -lt 2 ]; then echo "dpkg: error: dpkg frontend lock was locked by /usr/bin/python3.13 process with pid 7" >&2;'
        " exit 2; fi\n"
        'if [ "$MODE" = broken ]; then echo "dpkg: error processing package sl (--configure)" >&2; exit 1; fi\n'
        "echo Setting up sl\n"
    )
    fake.chmod(0o755)
    script = packages.CONFIGURE_PENDING.replace("sleep 5", "sleep 0")
    r = run_sh(script, f"{tmp_path}:/usr/bin:/bin")
    assert r.returncode == 0 and "Setting up sl" in r.stdout and count.read_text().strip() == "3"
    count.write_text("2")
    r = run_sh("MODE=broken; export MODE; " + script, f"{tmp_path}:/usr/bin:/bin")
    assert r.returncode == 1 and "error processing package sl" in r.stderr and count.read_text().strip() == "3"
    # the wait is bounded: with no time left, a held lock ends the loop with dpkg's message
    count.write_text("0")
    r = run_sh(script.replace(f"+ {packages.LOCK_WAIT_S} ))", "- 1 ))"), f"{tmp_path}:/usr/bin:/bin")
    assert r.returncode == 1 and "lock was locked by" in r.stderr and count.read_text().strip() == "1"


def test_every_apt_get_of_an_install_waits_for_the_lock():
    cmds = commands(packages._installed, {DebPackages: {}}, packages=["sl"], update=False, no_recommends=True)
    assert cmds == [
        'DEBIAN_FRONTEND=noninteractive apt-get -y -o Dpkg::Options::="--force-confdef" '
        '-o Dpkg::Options::="--force-confold" install --no-install-recommends -o DPkg::Lock::Timeout=600 sl'
    ]
    [update] = commands(packages.lists_updated, {})
    assert update == packages.retried_while_locked("apt-get -o DPkg::Lock::Timeout=600 update")


def test_apt_get_update_is_retried_while_the_lists_lock_is_held(tmp_path):
    """apt's DPkg::Lock::Timeout does not cover the lists lock (apt 2.6 fails at once with the
    option given, tried on this machine): the update is retried as dpkg is."""
    count = tmp_path / "n"
    count.write_text("0")
    fake = tmp_path / "apt-get"
    fake.write_text(
        "#!/bin/sh\n"
        f"n=$(cat {count}); echo $((n+1)) > {count}\n"
        'if [ "$n" -lt 1 ]; then echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 9 '
        '(apt-get)"; exit 100; fi\n'
        'if [ "$n" -eq 1 ] && [ "$MODE" = flaky ]; then echo "E: Failed to fetch http://deb.debian.org/ clock"; '
        "exit 100; fi\n"
        "echo Reading package lists...\n"
    )
    fake.chmod(0o755)
    script = packages.lists_updated._inner().__next__().replace("sleep 5", "sleep 0")
    r = run_sh(script, f"{tmp_path}:/usr/bin:/bin")
    assert r.returncode == 0 and "Reading package lists" in r.stdout and count.read_text().strip() == "2"
    # while it waits it says so, once per try, with apt's lock line (what an operator sees with -vvv)
    assert r.stderr.splitlines() == [
        f"{packages.WAITING} E: Could not get lock /var/lib/apt/lists/lock. It is held by process 9 (apt-get)"
    ]
    count.write_text("0")
    r = run_sh("MODE=flaky; export MODE; " + script, f"{tmp_path}:/usr/bin:/bin")
    assert r.returncode == 1 and "Failed to fetch" in r.stderr and count.read_text().strip() == "2"
