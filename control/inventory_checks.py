"""Checks of an inventory entry that no knob's shape holds: a placeholder left from the example
inventories, a key file that is not there, host-key checking left at pyinfra's accept-new, a host
name that is no name. Each yields Problems; control/profile.py runs them while the inventory loads."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Any

from control.connection import HOST_NAME
from control.defaults import KEY_URL, KNOBS, LISTEN, URL
from control.problems import Problem, control_char, non_ascii, safe_repr

PLACEHOLDER_LABEL = "example"  # the example inventories' hosts: gpu1.example.lan, gx10.example.lan
PLACEHOLDER_REF = "0" * 40
ADDRESS_PATTERNS = (URL["pattern"], KEY_URL["pattern"], LISTEN["pattern"])


def _placeholder_host(address: Any) -> bool:
    if not isinstance(address, str):
        return False
    host = re.sub(r"^[a-z]+://", "", address).split("/", 1)[0].rsplit(":", 1)[0]
    return PLACEHOLDER_LABEL in host.lower().split(".")


def placeholders(name: str, data: dict[str, Any]) -> Iterable[Problem]:
    """Values left from the example inventories: an example.lan host (as the host, its address or
    in a URL) and the forty-zero commit."""
    address = data.get("ssh_hostname") or name
    if _placeholder_host(address):
        yield Problem(
            name,
            "ssh_hostname" if data.get("ssh_hostname") else "(host name)",
            f"{address!r} is the example inventory's placeholder",
            "write your host's name or IP address",
        )
    for key, value in data.items():
        knob = KNOBS.get(key) if isinstance(key, str) else None
        if knob is None or not isinstance(value, str):
            continue
        if value == PLACEHOLDER_REF:
            yield Problem(
                name,
                key,
                "is the example inventory's placeholder (forty zeros)",
                "write the real commit: `git ls-remote <repository> <tag>`",
            )
        elif knob.pattern in ADDRESS_PATTERNS and _placeholder_host(value):
            yield Problem(name, key, f"{value!r} is an example address, a placeholder", "write the real address")


def first_contact(name: str, data: dict[str, Any]) -> Iterable[Problem]:
    """Mistakes a new user makes with a copied example inventory; pyinfra would otherwise stop
    on them only after connecting, or with a traceback."""
    fixes = {
        "ssh_key": "create one with `ssh-keygen -t ed25519`, install it on the host with `ssh-copy-id`, "
        "and name its private half here",
        "ssh_known_hosts_file": "fill it as the README's \"First real host\" says (ssh-keyscan, then compare the "
        "fingerprint with the one the host shows)",
    }
    for key, fix in fixes.items():
        value = data.get(key)
        if not value or not isinstance(value, str) or control_char(value):
            continue  # connection_problems() names wrong types and control characters
        path = os.path.expanduser(value)
        if not os.path.isfile(path):
            yield Problem(name, key, f"{value!r} does not exist on this machine (from {os.getcwd()})", fix)
        elif not os.access(path, os.R_OK):
            yield Problem(name, key, f"{value!r} is not readable by this user", "run as the user who owns it")


def host_key_checking(name: str, data: dict[str, Any]) -> Iterable[Problem]:
    """pyinfra's default is accept-new: the first connection (the run that ships the API key and
    the hub token) trusts whatever answers. Loopback is not exempt (a port there may be forwarded
    elsewhere); the sandbox's inventories set it, with known_hosts files of their own."""
    if not name.startswith("@") and data.get("ssh_strict_host_key_checking") != "yes":
        yield Problem(
            name,
            "ssh_strict_host_key_checking",
            f"{'is not set' if data.get('ssh_strict_host_key_checking') is None else 'is ' + safe_repr(data.get('ssh_strict_host_key_checking'))}"
            ": a host whose key is not known in advance would be trusted on first contact, with the secrets "
            "the deploy sends",
            "set ssh_strict_host_key_checking: 'yes' and ssh_known_hosts_file, filled as the README's "
            '"First real host" says',
        )


def check_name(name: Any) -> Iterable[Problem]:
    if not isinstance(name, str) or not name:
        yield Problem(safe_repr(name), "(host name)", "is not a host name", 'write it as a string, e.g. "gpu1.lan"')
        return
    if name.startswith("@"):
        return  # a pyinfra connector (@local, @chroot/...): pyinfra names it
    odd = control_char(name) or non_ascii(name)
    if odd or not re.fullmatch(HOST_NAME, name):
        found = f": it contains {odd}" if odd else ""
        yield Problem(
            safe_repr(name),
            "(host name)",
            f"is not a host name or address{found}",
            "write a DNS name, an IP address or an ssh_config alias (letters, digits, . _ : -)",
        )
