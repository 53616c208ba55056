"""Debian apt sources (deb822, with the non-free components) and base packages."""

from __future__ import annotations

from pyinfra import host
from pyinfra.operations import server
from pyinfra.operations.util import any_changed

from control.profile import Profile
from pyinfra_ext import memo
from roles.facts.apt import LEGACY_SOURCES, LegacyAptSources
from roles.operations import packages
from roles.operations.uploads import template


def apply(profile: Profile) -> None:
    # Before any apt command: a killed earlier run may have left dpkg half-way (roles/operations/packages.py).
    packages.dpkg_recovered(name="dpkg: nothing left interrupted (dpkg --configure -a if it was)")
    if not profile.on_platform.debian_sources:
        # DGX OS (Ubuntu 24.04) keeps its own apt sources (Ubuntu's and NVIDIA's): only the packages are ours.
        packages.installed(profile.base_packages, name="Base packages", update=True, no_recommends=True)
        return
    sources = template(
        "debian.sources.j2",
        "/etc/apt/sources.list.d/debian.sources",
        mode="644",
        name="Debian apt sources with contrib, non-free and non-free-firmware",
        mirror=profile.apt_mirror,
        security_mirror=profile.apt_security_mirror,
        suite=profile.debian_suite,
    )
    ops = [sources]
    if memo.fact(host, LegacyAptSources):
        # Kept, not deleted: the user's old file stays next to it for reference.
        ops.append(
            server.shell(
                name=f"Move the old {LEGACY_SOURCES} aside (kept as {LEGACY_SOURCES}.glm-flash-orig)",
                commands=[f"mv -n {LEGACY_SOURCES} {LEGACY_SOURCES}.glm-flash-orig"],
            )
        )
    packages.lists_updated(name="Refresh apt lists after the sources changed", _if=any_changed(*ops))
    packages.installed(profile.base_packages, name="Base packages", update=True, no_recommends=True)
