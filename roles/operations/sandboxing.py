"""The sandboxing of the transient units we start with systemd-run (their `-p` property lists).

Every unit the deploy starts runs what it cannot fully trust: the engine build runs setup.py of
sdists and, on the GB10 box, the fork's cmake; the download and the fleet's receive parse the
hub's and a peer's HTTP. Each gets what it can take, rated by `systemd-analyze security` on
Debian 13's systemd 257 (tests/sandbox/test_transient_hardening.py holds the figures):

- root_job(): a root build (glm-flash-job). No capabilities at all (root writes only files it
  owns, in the one tree it may write), the rest of the system read-only, private /tmp and
  devices, no kernel or cgroup tuning, the system-service syscalls only; no network unless
  the build fetches (the GB10 fork's checkout and its indexes).
- fetch_unit(): the download and receive units, which run as the downloader's own user: the
  same, plus no user namespace, no W+X memory, no /proc of other processes.
- engine_check(): the launch-flag check (files/glm-flash-check-flags), which imports the engine
  environment a sandboxed build just wrote: as the service user (who runs that environment
  anyway), nothing writable, no network; root reads its output as data and never executes the
  environment itself (a `.pth` dropped by a build step runs there, not as root).
- peer_fetch(): a fleet worker fetching artifacts from its peers (glm-flash-peer fetch --stage): as
  fetch_unit, but its own dynamic user whose only writable place is its StateDirectory= (root
  adopts the files from there by copy, hashed), and every address denied (the caller allows the
  sources: aria2 follows HTTP redirects and cannot be told not to; one elsewhere fails to connect).
- peer_server(): a fleet worker's file server (roles/fleet/artifacts.py): as fetch_unit, but its
  own dynamic user, nothing writable at all, IPv4/IPv6 only, and every address denied (the
  caller allows the transfer's receivers).

The failure mode is a build or download that needs more than it gets: it fails with EPERM,
EROFS or "Bad system call" in its journal (`journalctl -u UNIT`), the deploy stops for that
host, and nothing half-done becomes `current` or sealed.
"""

from __future__ import annotations

import posixpath

from pyinfra.api import OperationError

# What every transient unit of ours can take, root or not.
COMMON = [
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "PrivateTmp=yes",
    "PrivateDevices=yes",
    "ProtectKernelTunables=yes",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectClock=yes",
    "ProtectHostname=yes",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service",
    "SystemCallFilter=~@privileged @resources",
    "CapabilityBoundingSet=",
    "AmbientCapabilities=",
]
NETWORK = "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX"


def _writable(paths: list[str]) -> list[str]:
    """ReadWritePaths= of each path; one with a blank in double quotes (systemd unquotes them)."""
    out = []
    for p in paths:
        if not posixpath.isabs(p) or posixpath.normpath(p) in ("/", "//") or any(c in "\"\\\n" for c in p):
            raise OperationError(f"sandboxing: {p!r} cannot be a unit's writable path (absolute, below /, no quotes)")
        out.append(f'ReadWritePaths="{p}"' if any(c.isspace() for c in p) else f"ReadWritePaths={p}")
    return out


def root_job(writable: list[str], network: bool = False) -> list[str]:
    """A build as root: writes only `writable`; `network` for one that fetches."""
    props = [
        *COMMON,
        # An empty read-only /root and /home: tools that look for a config there (git, pip) see none.
        "ProtectHome=tmpfs",
        "ProtectProc=invisible",
        *_writable(writable),
        "UMask=0022",
    ]
    if network:
        return [*props, NETWORK]
    return [*props, "PrivateNetwork=yes", "RestrictAddressFamilies=AF_UNIX", "IPAddressDeny=any"]


def fetch_unit(writable: list[str]) -> list[str]:
    """A download or receive as the downloader's user: the network, and `writable` only."""
    return [
        *COMMON,
        "ProtectHome=yes",
        "ProtectProc=invisible",
        "ProcSubset=pid",
        "PrivateUsers=yes",
        "MemoryDenyWriteExecute=yes",
        "RemoveIPC=yes",
        NETWORK,
        *_writable(writable),
        "UMask=0022",
    ]


def engine_check(user: str) -> list[str]:
    """The launch-flag check: `user` (the service user) imports the new environment, writes
    nothing (its private /tmp aside), reaches no network, lives 15 minutes at most."""
    return [
        *COMMON,
        f"User={user}",
        "ProtectHome=yes",
        "ProtectProc=invisible",
        "PrivateUsers=yes",
        "RemoveIPC=yes",
        "KeyringMode=private",
        "PrivateNetwork=yes",
        "RestrictAddressFamilies=AF_UNIX",
        "IPAddressDeny=any",
        "UMask=0077",
        # a library's start-up may try a filtered call (thread affinity, memory policy): it gets EPERM, not SIGSYS
        "SystemCallErrorNumber=EPERM",
        # an engine's import may look for a cache under $HOME: the private /tmp
        "Environment=HOME=/tmp",
        "RuntimeMaxSec=900",
    ]


def peer_fetch() -> list[str]:
    """A fetch from the fleet's peers: a dynamic user, nothing writable but the caller's StateDirectory=,
    every address denied (the caller adds IPAddressAllow= of the sources)."""
    return [*fetch_unit([]), "DynamicUser=yes", "KeyringMode=private", "IPAddressDeny=any"]


def peer_server() -> list[str]:
    """A fleet worker's file server: a dynamic user that writes nothing and talks IP only; the
    caller adds IPAddressAllow= of the transfer's receivers to the IPAddressDeny=any here."""
    return [
        *COMMON,
        "DynamicUser=yes",
        "ProtectHome=read-only",
        "ProtectProc=invisible",
        "ProcSubset=pid",
        "PrivateUsers=yes",
        "PrivateIPC=yes",
        "MemoryDenyWriteExecute=yes",
        "RemoveIPC=yes",
        "KeyringMode=private",
        "DevicePolicy=closed",
        "UMask=0077",
        "RestrictAddressFamilies=AF_INET AF_INET6",
        "IPAddressDeny=any",
    ]
