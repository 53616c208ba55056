"""pyinfra's own inventory keys, read from the installed pyinfra, and the checks of their values.

An inventory may set, beside the profile's knobs, what pyinfra itself reads from host data: each
connector's data keys (`ssh_port`, `ssh_known_hosts_file`, ...: the connector's `data_cls`
TypedDict, with their types) and the operations' global arguments (`_sudo`, ...). Anything else
that looks like one (`ssh_known_host_file`) is a typo that pyinfra would silently ignore.
"""

from __future__ import annotations

import re
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, get_type_hints

from control.defaults import CONNECTOR_PREFIXES, LISTEN, PORT_KEYS
from control.problems import Problem, control_char, of_kind, safe_repr, strings

try:  # the bench's environment (.venv-bench) loads inventories without pyinfra
    from pyinfra.api.arguments import all_global_arguments
    from pyinfra.api.connectors import get_all_connectors
except ImportError:  # there pyinfra's keys pass by their prefix; pyinfra checks them when it runs
    all_global_arguments = get_all_connectors = None

try:
    PYINFRA_VERSION = version("pyinfra")
except PackageNotFoundError:
    PYINFRA_VERSION = "(not installed)"
HOST_NAME = r"(?![-.])[A-Za-z0-9_.:-]+"  # a DNS name, an address, or an ssh_config alias
USER = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
# pyinfra's sshuserclient.get_missing_host_key_policy() and the ssh connector's DataMeta text.
STRICT_CHOICES = ("yes", "accept-new", "no", "off", "ask")
TRANSFER_CHOICES = ("sftp", "scp")


@cache
def pyinfra_keys() -> dict[str, type] | None:
    """{key: type} of every host-data key the installed pyinfra reads; None without pyinfra."""
    if get_all_connectors is None:
        return None
    keys: dict[str, Any] = {}
    for connector in get_all_connectors().values():
        hints = get_type_hints(connector.data_cls)
        for key in connector.data_meta:
            keys[key] = hints.get(key, object)
    keys.update(all_global_arguments())
    return keys


def is_pyinfra_key(key: str) -> bool:
    known = pyinfra_keys()
    return key.startswith(CONNECTOR_PREFIXES) if known is None else key in known


def looks_like_pyinfra_key(key: str) -> bool:
    return key.startswith(CONNECTOR_PREFIXES)


def connection_problems(host: str, data: dict[str, Any]) -> list[Problem]:
    """The values of pyinfra's keys: their type (pyinfra's own), and a shape where our deploy relies on one."""
    problems = []
    known = pyinfra_keys() or {}
    for key, value in data.items():
        if not isinstance(key, str) or not is_pyinfra_key(key):
            continue
        kind = known.get(key)
        if isinstance(kind, type) and kind is not object and value is not None and not of_kind(value, kind):
            problems.append(
                Problem(
                    host,
                    key,
                    f"{safe_repr(value)} is {type(value).__name__}, pyinfra expects {kind.__name__}",
                    f"write it as a {kind.__name__}",
                )
            )
            continue
        bad = next((found for text in strings(value) if (found := control_char(text))), None)
        if bad:
            problems.append(Problem(host, key, f"{safe_repr(value)} contains {bad}", "remove that character"))
            continue
        problems.extend(_shape(host, key, value))
    user = data.get("ssh_user", "root")
    named = any(p.key == "ssh_user" for p in problems)  # a malformed user is named once, as that
    if (
        not named
        and isinstance(user, str)
        and user != "root"
        and data.get("_sudo") is not True
        and not data.get("_su_user")
    ):
        problems.append(
            Problem(
                host,
                "_sudo",
                f"ssh_user {safe_repr(user)} is not root and _sudo is not set: every step of the deploy runs as root",
                'add "_sudo": True (and give that user passwordless sudo: README, First real host)',
            )
        )
    return problems


# pyinfra sends these on the host's command line (`env PYINFRA_SUDO_PASSWORD=... sudo -A ...`) or
# keeps them in the inventory: every user of the host sees a command line in ps.
PASSWORD_KEYS = ("_sudo_password", "_su_password", "ssh_password")


def _shape(host: str, key: str, value: Any) -> list[Problem]:
    if key in PASSWORD_KEYS and value:
        return [
            Problem(
                host,
                key,
                "a password here reaches the host on a command line that every user of it can read (ps)",
                "log in with a key (ssh_key) and give the SSH user passwordless sudo: README, First real host; "
                "then remove this key",
            )
        ]
    if key == "ssh_port" and isinstance(value, int) and not 1 <= value <= 65535:
        return [Problem(host, key, f"{value} is not a TCP port", "use a port from 1 to 65535 (sshd's: usually 22)")]
    if key == "ssh_hostname" and isinstance(value, str) and not re.fullmatch(LISTEN["pattern"], value):
        return [Problem(host, key, f"{safe_repr(value)} is not a host name or address", "write e.g. gpu1.lan")]
    if key == "ssh_user" and isinstance(value, str) and not re.fullmatch(USER, value):
        return [Problem(host, key, f"{safe_repr(value)} is not a user name", "write e.g. root")]
    choices = {"ssh_strict_host_key_checking": STRICT_CHOICES, "ssh_file_transfer_protocol": TRANSFER_CHOICES}.get(key)
    if choices and value not in choices:
        return [
            Problem(host, key, f"{safe_repr(str(value))} is not one of {', '.join(choices)}", f"use {choices[0]!r}")
        ]
    return []


def port_problems(host: str, data: dict[str, Any], values: dict[str, Any]) -> list[Problem]:
    """The host's service ports against each other and against the port SSH connects to."""
    ssh_port = data.get("ssh_port", 22)
    problems = []
    seen: dict[int, str] = {}
    for key in PORT_KEYS:
        port = values[key]
        if port == ssh_port:
            problems.append(
                Problem(
                    host,
                    key,
                    f"{port} is the port SSH connects to (ssh_port {ssh_port})",
                    "give the service another port",
                )
            )
        elif port in seen:
            problems.append(Problem(host, key, f"{port} is also {seen[port]}", "give each service its own port"))
        seen.setdefault(port, key)
    return problems
