"""Debian packages present, checked from one read of dpkg's list per run (pyinfra_ext/memo.py), and
apt run the way a box that is also maintaining itself needs.

pyinfra's apt.packages reads the package list each time it is called (about 9 reads in a
deploy) and, with update=True, refreshes apt's lists once they are older than cache_time even
when every package is there, so a converged host would report a change once a day. Here a host
that has every package (at the pinned version, for `name=version`) is left alone; otherwise
pyinfra's own apt.packages updates and installs exactly as always.

Two things a real box does that a fresh sandbox does not (docs/sources.md §7b):
- unattended-upgrades or apt-daily hold dpkg's lock or apt's lists lock for minutes (right after
  boot, say after the driver's reboot): apt fails at once on a held lock unless told to wait. Every
  apt-get install of the deploy waits up to LOCK_WAIT_S (`-o DPkg::Lock::Timeout`, apt >= 1.9.11);
  `apt-get update` (whose lists lock that option does not cover) and dpkg are retried while locked
  for as long (`retried_while_locked`); then each fails with apt's or dpkg's own message.
- a dropped connection or a kill mid-install leaves dpkg interrupted: every later apt-get
  refuses ("dpkg was interrupted, you must manually run 'dpkg --configure -a'"). `dpkg_recovered`
  runs first in the deploy and finishes that work (`dpkg --configure -a`, waiting for the lock
  too), with a warning saying what it found.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.apt import noninteractive_apt
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt

from pyinfra_ext import memo
from roles.facts.apt import DpkgInterrupted

LOCK_WAIT_S = 600  # an unattended-upgrades run of a few packages; a longer one is worth a message
LOCK_WAIT = f"-o DPkg::Lock::Timeout={LOCK_WAIT_S}"
# apt's words; dpkg 1.22's ("dpkg frontend lock was locked by /usr/bin/python3 process with pid 7"); older dpkg's
LOCKED = '*"Could not get lock"*|*"lock was locked by"*|*"locked by another process"*'


# The line said at each retry (on stderr: pyinfra shows it with -vvv, and with the error if the wait runs out)
WAITING = f"glm-flash: waiting for a lock another process holds (retried every 5 s, {LOCK_WAIT_S} s at most):"


def retried_while_locked(command: str) -> str:
    """`command` (a shell command) run again every 5 s while it fails on a lock another process holds,
    saying so (WAITING, with the lock line of apt's or dpkg's message),
    for LOCK_WAIT_S at most; any other failure, or the lock still held then, fails with its own words.
    For what has no lock timeout of its own: dpkg, apt-mark (it runs dpkg --set-selections), and
    apt-get update (its lists lock: apt's DPkg::Lock::Timeout covers dpkg's locks only)."""
    return (
        f"end=$(( $(date +%s) + {LOCK_WAIT_S} )); "
        f"until out=$({command} 2>&1); do "
        f'case "$out" in {LOCKED}) if [ "$(date +%s)" -lt "$end" ]; then '
        f'echo "{WAITING} $(printf %s "$out" | grep -m1 lock)" >&2; sleep 5; continue; fi;; esac; '
        'echo "$out" >&2; exit 1; done; echo "$out"'
    )


UPDATE = retried_while_locked(f"apt-get {LOCK_WAIT} update")


def apt_get(args: str) -> str:
    """`apt-get -y <args>` without questions, waiting for dpkg's lock (pyinfra's noninteractive_apt plus the wait)."""
    return noninteractive_apt(f"{LOCK_WAIT} {args}")


def apt_install(packages, extra: str = "") -> StringCommand:
    """`apt-get install` of `packages` (each quoted) without recommends, waiting for dpkg's lock;
    `extra`: more options."""
    args = "install --no-install-recommends" + (f" {extra}" if extra else "")
    return StringCommand(apt_get(args), *[QuoteString(p) for p in packages])


def missing(installed: dict[str, list[str]], packages: list[str]) -> list[str]:
    """Of `packages` (`name` or `name=version`), those dpkg's list lacks."""
    out = []
    for spec in packages:
        name, _, version = spec.partition("=")
        if name not in installed or (version and version not in installed[name]):
            out.append(spec)
    return out


def installed(packages: list[str], name: str, update: bool = False, no_recommends: bool = False):
    memo.want(host, DebPackages)
    return _installed(packages=list(packages), update=update, no_recommends=no_recommends, name=name)


@operation()
def _installed(packages: list[str], update: bool, no_recommends: bool):
    """
    Debian packages installed by pyinfra's apt.packages, waiting for dpkg's lock, when dpkg's
    list lacks one of them.

    + packages: `name` or `name=version` each
    + update: refresh apt's lists first when they are older than a day
    + no_recommends: install without the recommended packages
    """
    lacking = missing(memo.fact(host, DebPackages), packages)
    if not lacking:
        host.noop(f"packages installed: {', '.join(packages)}")
        return
    if update:  # pyinfra's own update (lists older than a day), waiting for the lock
        yield from (UPDATE if c == "apt-get update" else c for c in apt.update._inner(cache_time=86400))
    yield from apt.packages._inner(packages=packages, no_recommends=no_recommends, extra_install_args=LOCK_WAIT)


@operation()
def lists_updated():
    """apt's lists refreshed (run with `_if`: after the sources changed), waiting for the lock."""
    yield UPDATE


CONFIGURE_PENDING = retried_while_locked(
    "DEBIAN_FRONTEND=noninteractive dpkg --force-confdef --force-confold --configure -a"
)


def dpkg_recovered(name: str):
    memo.want(host, DpkgInterrupted)  # read with the run's first facts, in the same command
    return _dpkg_recovered(name=name)


@operation()
def _dpkg_recovered():
    """dpkg is not left interrupted: what a killed install left half-done (pending journal entries,
    packages unpacked or half-configured) is finished with `dpkg --configure -a` before any apt
    command, and the run says so."""
    reasons = memo.fact(host, DpkgInterrupted)
    if not reasons:
        host.noop("dpkg: nothing left interrupted")
        return
    logger.warning(
        f"{host.name}: dpkg was left interrupted ({'; '.join(reasons)}): finishing it with dpkg --configure -a"
    )
    yield CONFIGURE_PENDING
