"""apt holds as a pyinfra operation (pyinfra 3.10 has none; the fact is roles/facts/apt.py).

A held package is skipped by `apt upgrade` and unattended-upgrades, so a driver or
kernel cannot move under a running engine and cause a driver/library version mismatch.

    from roles.operations import apt_hold
    apt_hold.held(name="Hold the driver", packages=["nvidia-driver-cuda", "libcuda1"])
    apt_hold.held(name="Release it", packages=["nvidia-driver-cuda"], present=False)
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import OperationValueError, QuoteString, StringCommand, operation

from pyinfra_ext import memo
from roles.facts.apt import PACKAGE_NAME, AptHeldPackages
from roles.operations.packages import retried_while_locked


def _is_held(package: str, held: set[str]) -> bool:
    # A native-architecture package is listed bare even when asked for as `name:arch`.
    return package in held or package.partition(":")[0] in held


def validate_packages(packages) -> list[str]:
    """Return the names in order without duplicates; raise OperationValueError on bad input."""
    if isinstance(packages, str):
        packages = [packages]
    if not isinstance(packages, (list, tuple)):
        raise OperationValueError(
            f"apt_hold.held: packages must be a package name or a list of names, not {type(packages).__name__}"
        )
    bad = [repr(p) for p in packages if not isinstance(p, str) or not PACKAGE_NAME.match(p)]
    if bad:
        raise OperationValueError(
            f"apt_hold.held: not a Debian package name: {', '.join(bad)} "
            "(lower case letters, digits, + - . and an optional :arch)"
        )
    return list(dict.fromkeys(packages))


@operation()
def held(packages: str | list[str], present: bool = True):
    """
    Hold packages at their installed version (`present=True`) or release them.

    + packages: a package name or a list of names, as apt-mark takes them
    + present: True holds, False releases the hold

    Only packages whose hold state differs are passed to `apt-mark`, so a second run
    yields no command. A package apt does not know makes apt-mark fail, which fails
    the operation: a hold on a name that does not exist protects nothing.
    """
    if not isinstance(present, bool):
        raise OperationValueError(f"apt_hold.held: present must be true or false, not {present!r}")
    names = validate_packages(packages)
    if not names:
        host.noop("no packages to hold")
        return

    currently_held = set(memo.fact(host, AptHeldPackages))
    todo = [p for p in names if _is_held(p, currently_held) != present]
    if not todo:
        host.noop(f"{', '.join(names)} already {'held' if present else 'not held'}")
        return
    # apt-mark changes dpkg's selections: it fails at once while another process holds dpkg's lock.
    mark = StringCommand("apt-mark", "hold" if present else "unhold", *[QuoteString(p) for p in todo]).get_raw_value()
    yield retried_while_locked(mark)
