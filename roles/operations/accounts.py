"""System groups and users, checked from cheap, batched reads; pyinfra's server.group/user change them.

As roles/operations/paths.py: a check here may only be stricter than pyinfra's own.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.facts.server import Groups
from pyinfra.operations import server

from pyinfra_ext import memo
from roles.facts.accounts import Account


def group(name: str, op_name: str):
    memo.want(host, Groups)
    return _group(group=name, name=op_name)


@operation()
def _group(group: str):
    """
    A system group, made by pyinfra's server.group when the host lacks it.

    + group: the group's name
    """
    if group in memo.fact(host, Groups):
        host.noop(f"group {group} exists")
        return
    yield from server.group._inner(group=group, system=True)


def user(name: str, group: str, groups: list[str], home: str, shell: str, op_name: str):
    """A system user without a home directory of its own making (the role creates it with its mode)."""
    memo.want(host, Account, user=name)
    return _user(user=name, group=group, groups=groups, home=home, shell=shell, name=op_name)


@operation()
def _user(user: str, group: str, groups: list[str], home: str, shell: str):
    """
    A system user as the profile wants it, made or changed by pyinfra's server.user (no home
    directory of its own making: the role creates it with its mode).

    + user: the user's name
    + group: its primary group
    + groups: its other groups, exactly these
    + home: its home directory
    + shell: its login shell (nologin for a service)
    """
    info = memo.fact(host, Account, user=user)
    if info and (info.home, info.shell, info.group, info.groups) == (home, shell, group, frozenset(groups)):
        host.noop(f"user {user} exists")
        return
    yield from server.user._inner(
        user=user, group=group, groups=groups, system=True, shell=shell, home=home, create_home=False
    )
