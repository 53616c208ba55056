"""Artifacts cross the control machine's link once per fleet, not once per worker.

The control machine uploads what a worker needs from it (the engine's CPython, the engine's
wheels) to one worker, the seed (the first of the `workers` group that the run reached); the seed serves exactly
those files (files/glm-flash-peer, a manifest of `sha256 size mode relpath`) on its worker
address while the others fetch what they lack from it, each file checked against the sha256 the
control machine took from the lock, then stops. The files land where deploy.py's roles upload
them, so those roles find them present (pyinfra's files.put compares checksums when it runs) and
send nothing. A worker with a complete copy sends and receives nothing; a fleet where nobody
lacks anything starts no server.

The checkpoint travels the same way (roles/fleet/checkpoint.py, with this module's server).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from pyinfra import host, inventory, state
from pyinfra.operations import server

from control import layout, run_record
from control.fleet import PEER_PORT, WORKERS, worker_url
from control.profile import Profile
from control.pypi_cache import sha256_file
from pyinfra_ext import memo
from roles import engines
from roles.facts.engine import WheelhouseFiles
from roles.operations import packages, paths
from roles.operations.uploads import host_tool

UNIT = "glm-flash-peer-serve"  # -<name> of the set


@dataclass(frozen=True)
class Entry:
    src: Path | None  # on the control machine; None: made on the seed by an earlier operation (a download)
    sha256: str
    size: int
    mode: str
    rel: str  # under install_root on the hosts

    def line(self) -> str:
        return f"{self.sha256} {self.size} {self.mode} {self.rel}\n"


def entry(src: Path, mode: str, rel: str, sha256: str | None = None) -> Entry:
    side = src.with_name(src.name + ".sha256")  # written by control.engine_lock.fetch
    if sha256 is None and side.exists():
        sha256 = side.read_text().split()[0]
    return Entry(src, sha256 or sha256_file(src), src.stat().st_size, mode, rel)


def engine_entries(profile: Profile) -> list[Entry]:
    """What deploy.py's engine would upload to each worker from the control machine (its artifacts())."""
    return [entry(u.src, u.mode, u.rel, u.sha256) for u in engines.for_profile(profile).artifacts(profile)]


def lacking(target, root: str, entries: list[Entry]) -> list[Entry]:
    """Entries a host has not (or not at their size), from its directory listings."""
    listings = {}
    for e in entries:
        d = str(Path(root, e.rel).parent)
        if d not in listings:
            listings[d] = memo.fact(target, WheelhouseFiles, path=d)
    return [e for e in entries if listings[str(Path(root, e.rel).parent)].get(Path(e.rel).name) != e.size]


def reached() -> list:
    """The `workers` this run reached: one that is down stops neither the seed nor its peers."""
    # A single host, the gateway, or a plan test's stand-in host (no inventory behind it).
    if WORKERS not in getattr(host, "groups", ()):
        return []
    return [h for h in inventory.get_group(WORKERS) if h in state.active_hosts]


def address(worker) -> str:
    return worker_url(worker.name, worker.data.dict()).split("//")[1].rsplit(":", 1)[0].strip("[]")


def serving(unit: str, tool: str, root: str, mfile: str, bind: str, extra: str = "") -> list[str]:
    """Start glm-flash-peer's server as a transient unit: read-only to everything but the network."""
    q = shlex.quote
    return [
        f"systemctl stop {unit} 2>/dev/null; systemctl reset-failed {unit} 2>/dev/null; "
        f"systemd-run -q --unit {unit} -p RuntimeMaxSec=3h -p NoNewPrivileges=yes "
        f"-p ProtectSystem=strict -p ProtectHome=yes -p PrivateTmp=yes "
        f"-p CapabilityBoundingSet=CAP_DAC_READ_SEARCH "
        f"{q(tool)} serve {q(root)} {q(mfile)} --bind {q(bind)} --port {PEER_PORT}{extra}"
    ]


def stopping(unit: str) -> list[str]:
    # --sync: the server's last line ("sent N bytes", printed as it stops) may still sit in
    # journald's stream socket when the stop returns; systemd >= 256 reads it in before returning.
    return [
        f"systemctl stop {unit}; journalctl --sync 2>/dev/null; "
        f"journalctl -u {unit} -o cat --no-pager | grep -F sent | tail -n 1"
    ]


def apply(profile: Profile, entries: list[Entry], name: str = "artifacts", root: str | None = None) -> None:
    """Every reached worker ends with `entries` under `root` (install_root by default). `name` tells
    sets apart (their manifests and servers): e.g. "artifacts" here, "checkpoint" for a model role
    whose seed downloads the files (entries without src) in an operation defined before this call."""
    workers = reached()
    if not entries or host not in workers:
        return
    seed, root, q = workers[0], root or profile.install_root, shlex.quote
    seed_address = address(seed)
    fleet_dir, bin_dir = layout.fleet_dir(profile), layout.bin_dir(profile)
    tool, mfile, unit = layout.tool(profile, "glm-flash-peer"), f"{fleet_dir}/{name}.txt", f"{UNIT}-{name}"
    paths.directory(name="Fleet directory", path=fleet_dir, mode="755")
    paths.directory(name="Host tools directory", path=bin_dir, mode="755")
    host_tool("glm-flash-peer", bin_dir)
    paths.put(
        name=f"Manifest of the fleet's {name} ({len(entries)} files)",
        src=StringIO("".join(e.line() for e in entries)),
        dest=mfile,
        mode="644",
    )
    packages.installed(["python3"], name="python3 for glm-flash-peer", update=True)
    if host == seed:
        mine = [e for e in lacking(host, root, entries) if e.src is not None]
        for d in sorted({str(Path(root, e.rel).parent) for e in mine}):
            paths.directory(name=f"Directory {d}", path=d, mode="755")
        for e in mine:
            paths.put(name=f"From the control machine: {e.rel}", src=str(e.src), dest=f"{root}/{e.rel}", mode=e.mode)
    peers_lack = [h.name for h in workers[1:] if lacking(h, root, entries)]
    if not peers_lack:
        return
    run_record.current().seeded_by.update(dict.fromkeys(peers_lack, seed.name))
    # The next three operations are defined on every worker (empty where they do nothing), so they are
    # the same operations for pyinfra: it runs the seed's serving before any fetch, the fetches before
    # the seed stops.
    server.shell(
        name=f"Serve the {name} from {seed.name} on {seed_address}:{PEER_PORT} (to {', '.join(peers_lack)})",
        commands=serving(unit, tool, root, mfile, seed_address) if host == seed else [],
    )
    server.shell(
        name=f"Fetch the {name} missing here from {seed.name} on the local network (hashes checked)",
        commands=[f"{q(tool)} fetch http://{seed_address}:{PEER_PORT} {q(root)} {q(mfile)}"]
        if host.name in peers_lack
        else [],
    )
    server.shell(name=f"Stop serving the {name} on {seed.name}", commands=stopping(unit) if host == seed else [])
