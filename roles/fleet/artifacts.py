"""Artifacts cross the control machine's link once per fleet, not once per worker.

The transfer list (a manifest of `sha256 size mode relpath`) is the same on every worker: the
engine's CPython archive (kept, 0644, after it is unpacked) and its wheels, each with the hash the
control machine took from the lock. A file no reached worker holds goes from the control machine
to the first reached worker (the first that lacks it), only to that one. Then every worker that
lacks files fetches them from every worker that holds them (files/glm-flash-peer: aria2 with a
Metalink of one URL per holder, each file checked against the manifest before its rename), so no
one worker's uplink carries every copy. The files land where deploy.py's roles upload them, so
those roles find them present (pyinfra's files.put compares checksums when it runs) and send
nothing. A worker with a complete copy receives nothing; a fleet where nobody lacks anything
starts no server.

The servers (serving()): a transient unit per holder with its own dynamic user, no capabilities,
the system read-only, the transfer's random token as a systemd credential (a root-only file on
server and receivers, never in argv or the journal; 401 without it), the receivers' addresses
only (IPAddressAllow=, and the server's own 403: containers may not enforce the former), bound
to the worker's `fleet_address` (its SSH address when unset). It is stopped after the transfer,
stops itself after IDLE_S without a request (a killed deploy) and lives RUNTIME_MAX_S at most.

The checkpoint travels the same way (roles/fleet/checkpoint.py, with this module's server).
"""

from __future__ import annotations

import ipaddress
import secrets
import shlex
import socket
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

from pyinfra import host, inventory, state
from pyinfra.operations import server

from control import layout, run_record
from control.fleet import PEER_PORT, WORKERS, peer_address
from control.profile import Profile
from control.pypi_cache import sha256_file
from pyinfra_ext import memo
from roles.engines import dispatch
from roles.facts.engine import WheelhouseFiles
from roles.operations import packages, paths, sandboxing
from roles.operations.fleet_transfer import peer_token_placed
from roles.operations.job import name_released
from roles.operations.secrets import Secret
from roles.operations.uploads import host_tool
from roles.watch import listen_address

UNIT = "glm-flash-peer-serve"  # -<name of the set>-<run's tag> (server_unit)
IDLE_S = 120  # a server with no request for this long stops itself (a killed deploy leaves none)
# The longest a server lives: one copy of 306 GiB at 1 Gbit/s takes about 45 min; a transfer cut
# here fails its run, and the next run resumes it (aria2 keeps what it received).
RUNTIME_MAX_S = 3600
LISTEN_S = 90  # a server's start, until its socket listens (listening())
CREDENTIAL = "peer-token"
FETCH_UNIT = "glm-flash-peer-fetch"  # -<name> of the set; its StateDirectory= too
# glm-flash-peer's DEADLINE_S and FLOOR_BPS (the fetch's own deadline), and a margin past it
FETCH_DEADLINE_S, FETCH_FLOOR_BPS, FETCH_SLACK_S = 900, 4 << 20, 300
# glm-flash-peer, the multi-source downloader it drives, and ss (listening(): a server's socket waited for)
PACKAGES = ["python3", "aria2", "iproute2"]
# The server's unit: its own dynamic user, nothing writable, no privileges (systemd-analyze security
# rates it; tests/fleet/test_peer_server.py holds the figure).
SERVER_PROPERTIES = sandboxing.peer_server()


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
    """What deploy.py's engine would upload to each worker from the control machine (its artifacts()):
    the same list on every worker."""
    return [entry(u.src, u.mode, u.rel, u.sha256) for u in dispatch.for_profile(profile).artifacts(profile)]


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
    """Where the fleet's workers reach this one: its `fleet_address`, else its SSH address."""
    return peer_address(worker.name, worker.data.dict())


def ips(worker) -> list[str]:
    """The worker's fleet address as IP addresses (a host name resolved here, on the control machine)."""
    where = address(worker)
    try:
        return [str(ipaddress.ip_address(where))]
    except ValueError:
        pass
    try:
        return sorted({i[4][0] for i in socket.getaddrinfo(where, None, proto=socket.IPPROTO_TCP)})
    except OSError as e:
        raise SystemExit(
            f"glm-flash: {worker.name}: its address {where} does not resolve here ({e}); "
            "set fleet_address to its IP address on the fleet's network"
        ) from None


def url(worker) -> str:
    return f"http://{listen_address(address(worker), PEER_PORT)}"


def token(name: str) -> Secret:
    """The transfer's token: random, one per set and run, shared by its servers and receivers."""
    tokens = run_record.current().peer_tokens
    if name not in tokens:
        tokens[name] = Secret(secrets.token_urlsafe(32))
    return tokens[name]


def token_path(profile: Profile, name: str) -> str:
    return f"{layout.fleet_dir(profile)}/tokens/{name}.token"


def token_placed(profile: Profile, name: str) -> None:
    """The transfer's token root-only (0600) here, in a directory only root may enter."""
    peer_token_placed(
        name=f"The token of this run's {name} transfer (root only)", dest=token_path(profile, name), secret=token(name)
    )


def server_unit(name: str) -> str:
    """The peer server's unit name for the set `name` in this run: a name of its own each run. systemd
    257 was seen holding a stopped server's name for about 135 s (stop and reset-failed did not free
    it) while the next run waited to take it, and meanwhile another worker's server, started on time,
    stopped itself for want of a request; a fresh name is never held."""
    return f"{UNIT}-{name}-{run_record.current().run_tag}"


def serving(
    unit: str,
    tool: str,
    root: str,
    mfile: str,
    bind: str,
    allow: list[str],
    token_file: str,
    idle: int = IDLE_S,
) -> list[str]:
    """Start glm-flash-peer's server as a transient unit: its own dynamic user, no privileges, the
    receivers' addresses only; the token a credential. The root-only file stays: a worker that both
    serves and receives (it holds some files and lacks others) reads it for its own fetch, which
    removes it after, as the stop does (stopping)."""
    q = shlex.quote
    props = [*SERVER_PROPERTIES, f"RuntimeMaxSec={RUNTIME_MAX_S}", f"LoadCredential={CREDENTIAL}:{token_file}"]
    props.append("IPAddressAllow=" + " ".join(allow))
    allowed = "".join(f" --allow {q(a)}" for a in allow)
    return [
        "since=$(date +%s) && "
        f"systemd-run -q --collect --service-type=exec --unit {unit} "
        + " ".join(f"-p {q(p)}" for p in props)
        + f" -- /usr/bin/python3 {q(tool)} serve {q(root)} {q(mfile)} --bind {q(bind)} --port {PEER_PORT}"
        f" --token-credential {CREDENTIAL} --idle {int(idle)}{allowed} && " + listening(unit, bind, PEER_PORT)
    ]


def listening(unit: str, bind: str, port: int, timeout: int = LISTEN_S) -> str:
    """Shell that returns once the unit's own process listens on the address (ss, the kernel's own
    table, with the socket's process), so no receiver of this run meets a server still starting:
    `--service-type=exec` returns once Python is running, before it binds (a receiver found a
    worker's port closed for 30 s on a loaded CI machine). Another process's socket on the address
    does not count: the server then fails to bind, and the operation fails with its log instead of
    passing on a listener that is not ours. A server that ended first fails the operation with its
    own journal lines; one still not listening after `timeout` seconds fails it too. (Readiness by
    sd_notify would need AF_UNIX, which the server's sandbox denies.)"""
    where = shlex.quote(listen_address(bind, port))
    why = f"glm-flash: the peer server {unit}"
    log = f"journalctl -u {unit} --since @$since -o cat --no-pager >&2"
    return (
        f"n=0; until ss -Hltnp src {where} | grep -qF \"pid=$(systemctl show -P MainPID {unit}.service),\"; do "
        f"if ! systemctl -q is-active {unit}.service; then "
        f"echo '{why} ended before it listened on '{where}': its log:' >&2; journalctl --sync; {log}; exit 1; fi; "
        f"n=$((n + 1)); [ $n -le {timeout * 5} ] || {{ echo '{why} does not listen on '{where}' after {timeout} s' >&2; "
        f"{log}; exit 1; }}; sleep 0.2; done"
    )


def stopping(unit: str, token_file: str = "") -> list[str]:
    # --sync: the server's last line ("sent N bytes", printed as it stops) may still sit in
    # journald's stream socket when the stop returns; systemd >= 256 reads it in before returning.
    rm = f"rm -f {shlex.quote(token_file)}; " if token_file else ""
    return [
        f"{rm}systemctl stop {unit} 2>/dev/null; journalctl --sync 2>/dev/null; "
        f"journalctl -u {unit} -o cat --no-pager | grep -F sent | tail -n 1"
    ]


def ip_url(worker) -> str:
    """url() with the worker's address as an IP: the fetch unit reaches no resolver."""
    return f"http://{listen_address(ips(worker)[0], PEER_PORT)}"


def fetch_deadline(nbytes: int) -> int:
    """The fetch unit's RuntimeMaxSec=: glm-flash-peer's own (aria2 --stop: DEADLINE_S plus the bytes at
    FLOOR_BPS) and FETCH_SLACK_S for asking the holders and hashing."""
    return FETCH_DEADLINE_S + nbytes // FETCH_FLOOR_BPS + FETCH_SLACK_S


def fetching(
    tool: str, root: str, mfile: str, sources: list, receiver, token_file: str, name: str = "artifacts", nbytes: int = 0
) -> list[str]:
    """The fetch as a transient unit (sandboxing.peer_fetch: its own dynamic user, writing only its
    StateDirectory, reaching only the sources, a deadline), then root's `adopt` of what it staged:
    copied into `root` while hashed, root's, the manifest's mode. The token reaches the unit as a
    credential; root's file of it is removed once the unit has ended, however it ended."""
    q = shlex.quote
    unit = f"{FETCH_UNIT}-{name}"
    stage = f"/var/lib/{unit}"  # the unit's StateDirectory= (a link into /var/lib/private, root's)
    props = [
        *sandboxing.peer_fetch(),
        f"StateDirectory={unit}",
        f"LoadCredential={CREDENTIAL}:{token_file}",
        "IPAddressAllow=" + " ".join(sorted({ip for s in sources for ip in ips(s)})),
        f"RuntimeMaxSec={fetch_deadline(nbytes)}",
    ]
    froms = "".join(f" --source {q(ip_url(s))}" for s in sources)
    return [
        f"{name_released(unit + '.service')}; "
        f"systemd-run --quiet --wait --pipe --collect --service-type=exec --unit {unit} "
        + " ".join(f"-p {q(p)}" for p in props)
        + f" -- /usr/bin/python3 {q(tool)} fetch {q(root)} {q(mfile)}{froms} --token-credential {CREDENTIAL}"
        f" --interface {q(ips(receiver)[0])} --stage {stage} </dev/null; rc=$?; rm -f {q(token_file)}; "
        f"/usr/bin/python3 {q(tool)} adopt {stage} {q(root)} {q(mfile)}; a=$?; [ $rc -eq 0 ] || exit $rc; exit $a"
    ]


def idle_seconds(profile: Profile) -> int:
    return int(profile.fleet_peer_idle_s)


def apply(profile: Profile, entries: list[Entry], name: str = "artifacts", root: str | None = None) -> None:
    """Every reached worker ends with `entries` under `root` (install_root by default). `name` tells
    sets apart (their manifests and servers): e.g. "artifacts" here."""
    workers = reached()
    if not entries or host not in workers:
        return
    root, first = root or profile.install_root, workers[0]
    fleet_dir, bin_dir = layout.fleet_dir(profile), layout.bin_dir(profile)
    tool, mfile, unit = layout.tool(profile, "glm-flash-peer"), f"{fleet_dir}/{name}.txt", server_unit(name)
    paths.directory(name="Fleet directory", path=fleet_dir, mode="755")
    paths.directory(name="Host tools directory", path=bin_dir, mode="755")
    host_tool("glm-flash-peer", bin_dir)
    paths.put(
        name=f"Manifest of the fleet's {name} ({len(entries)} files)",
        src=StringIO("".join(e.line() for e in entries)),
        dest=mfile,
        mode="644",
    )
    packages.installed(PACKAGES, name="python3, aria2 and iproute2 for glm-flash-peer", update=True)
    lacks = {h: {e.rel for e in lacking(h, root, entries)} for h in workers}
    # Files nobody holds come from the control machine to the first reached worker, only to it.
    nobody = [e for e in entries if all(e.rel in lacks[h] for h in workers)]
    if host == first:
        mine = [e for e in nobody if e.src is not None]
        for d in sorted({str(Path(root, e.rel).parent) for e in mine}):
            paths.directory(name=f"Directory {d}", path=d, mode="755")
        for e in mine:
            paths.put(name=f"From the control machine: {e.rel}", src=str(e.src), dest=f"{root}/{e.rel}", mode=e.mode)
    holds = {h: {e.rel for e in entries} - lacks[h] for h in workers}
    holds[first] |= {e.rel for e in nobody}
    receivers = [h for h in workers if lacks[h] - {e.rel for e in nobody if h is first}]
    if not receivers:
        return
    wanted = set().union(*(lacks[r] for r in receivers))
    servers = [h for h in workers if holds[h] & wanted and any(lacks[r] & holds[h] for r in receivers if r is not h)]
    sources_of = {r: [s for s in servers if s is not r and lacks[r] & holds[s]] for r in receivers}
    # The summary names the first source of a receiver that failed once that source became unreachable.
    run_record.current().seeded_by.update({r.name: sources_of[r][0].name for r in receivers if sources_of[r]})
    tfile = token_path(profile, name)
    if host in servers or host in receivers:
        token_placed(profile, name)
    allow = sorted({ip for r in receivers for ip in ips(r)})
    # The next three operations are defined on every worker (empty where they do nothing), so they are
    # the same operations for pyinfra: it runs every server's start before any fetch, the fetches
    # before the servers stop.
    server.shell(
        name=f"Serve the {name} from {', '.join(s.name for s in servers)} (to {', '.join(r.name for r in receivers)})",
        commands=serving(unit, tool, root, mfile, address(host), allow, tfile, idle=idle_seconds(profile))
        if host in servers
        else [],
    )
    server.shell(
        name=f"Fetch the {name} missing here from the fleet's workers that hold them (hashes checked)",
        commands=fetching(
            tool, root, mfile, sources_of[host], host, tfile, name, sum(e.size for e in entries if e.rel in lacks[host])
        )
        if host in receivers
        else [],
    )
    server.shell(name=f"Stop serving the {name}", commands=stopping(unit, tfile) if host in servers else [])
