"""The checkpoint crosses the outside link once per fleet: the seed is a worker that already holds
it verified, else the first reached worker, which downloads it from the hub as a single host does;
the workers that lack it receive it from the seed, checked against the seed's verified marker
(roles/operations/fleet_transfer.py says how it travels and who writes), over the same server as the
fleet's artifacts (roles/fleet/artifacts.py).

The model role (roles/model.py) knows nothing of a fleet: it downloads alone unless the run has
registered another way to share its checkpoints (model.shared_by). deploy_fleet.py registers
this module's, through share(), before the single-host deploy runs; the model role then asks it
who seeds (plan) and, once the seed's download is verified, lets it copy (copied), at the same
point of the run as before, so the seed serves only a verified tree. The checkpoint lands where
deploy.py's model role puts it.
"""

from __future__ import annotations

import sys

from pyinfra import host
from pyinfra.operations import server

from control import layout, run_record
from control.fleet import PEER_PORT
from control.profile import Profile
from roles import model
from roles.fleet.artifacts import (
    address,
    idle_seconds,
    ips,
    reached,
    server_unit,
    serving,
    stopping,
    token_path,
    token_placed,
    url,
)
from roles.operations.fleet_transfer import checkpoint_exported, checkpoint_received
from roles.operations.uploads import host_tool


def share() -> None:
    """This run's checkpoints are shared among the fleet's workers (plan and copied below)."""
    model.shared_by(sys.modules[__name__])


def plan(complete) -> tuple:
    """(seed, names of the workers that lack the checkpoint, those that serve it); (None, [], []) outside
    a fleet of two or more reached workers. complete(host): whether that host holds the checkpoint
    verified. Every worker that holds it verified serves it (the seed alone when nobody does: it downloads)."""
    workers = reached()
    if host not in workers or len(workers) < 2:
        return None, [], []
    have = [h for h in workers if complete(h)]
    seed = have[0] if have else workers[0]
    return seed, [h.name for h in workers if h is not seed and h not in have], have or [seed]


def copied(profile: Profile, plan: model.Plan) -> None:
    """The workers in `plan.lacking` receive the checkpoint of `plan.download` from every worker that
    holds it (the seed has it by now: downloaded by an operation defined before this call). Defined on
    every worker (empty where they do nothing), so pyinfra runs the servers' start before any receive,
    the receives before the servers stop."""
    seed, lacking, sources, d, unit = plan.seed, plan.lacking, plan.sources, plan.download, plan.download["unit"]
    receivers = [h for h in reached() if h.name in lacking]
    run_record.current().seeded_by.update(dict.fromkeys(lacking, seed.name))
    peer = layout.tool(profile, "glm-flash-peer")
    host_tool("glm-flash-peer", layout.bin_dir(profile))
    fleet_dir = layout.fleet_dir(profile)
    serve_unit, mfile, tfile = server_unit(unit), f"{fleet_dir}/{unit}.txt", token_path(profile, unit)
    if host in sources or host in receivers:
        token_placed(profile, unit)
    allow = sorted({ip for r in receivers for ip in ips(r)})
    checkpoint = dict(seed=seed.name, path=d["path"], tool=d["tool"], repo_id=d["repo_id"], commit=d["commit"])
    names = ", ".join(s.name for s in sources)
    checkpoint_exported(
        name=f"Serve the checkpoint from {names} on port {PEER_PORT} (to {', '.join(lacking)})",
        servers=[s.name for s in sources],
        manifest=mfile,
        serve=serving(serve_unit, peer, d["path"], mfile, address(host), allow, tfile, idle_seconds(profile)),
        # the seed's marker is held against the hub's own file list before it reaches a receiver
        hub_endpoint=profile.hf_endpoint,
        hub_token=d["token"],
        **checkpoint,
    )
    checkpoint_received(
        name=f"Receive the checkpoint from {names} on the local network (checked against its verified hashes)",
        lacking=lacking,
        **checkpoint,
        sources=[url(s) for s in sources],
        interface=address(host),
        token_file=tfile,
        peer_tool=peer,
        marker=f"{fleet_dir}/{unit}.json",
        fetch_user=d["fetch_user"],
        unit=f"{unit}-peer",
    )
    server.shell(
        name=f"Stop serving the checkpoint on {names}",
        commands=stopping(serve_unit, tfile) if host in sources else [],
    )
