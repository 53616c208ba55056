"""Debian packages present, checked from one read of dpkg's list per run (roles/facts/memo.py).

pyinfra's apt.packages reads the package list each time it is called (about 9 reads in a
deploy) and, with update=True, refreshes apt's lists once they are older than cache_time even
when every package is there, so a converged host would report a change once a day. Here a host
that has every package (at the pinned version, for `name=version`) is left alone; otherwise
pyinfra's own apt.packages updates and installs exactly as always.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import apt

from roles.facts import memo


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
    lacking = missing(memo.fact(host, DebPackages), packages)
    if not lacking:
        host.noop(f"packages installed: {', '.join(packages)}")
        return
    yield from apt.packages._inner(
        packages=packages, update=update, cache_time=86400 if update else None, no_recommends=no_recommends
    )
