"""The end of every deploy: per host, what serves where, from what, and what was left undone.

The last operation of deploy.py reads the host at run time (`glm-flash status --json --quick`, the
reboot check of roles/driver.py); when pyinfra exits, the summary of every host, refused and
failed ones included, goes to stderr (stdout stays pyinfra's: valid JSON with --json) and, when
GLM_FLASH_SUMMARY_JSON names a file, as JSON into it for scripts.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys

from pyinfra import host
from pyinfra.api.state import State
from pyinfra.context import state as state_proxy

from control import layout, run_record
from control.profile import Profile
from roles.facts.status import HostStatus
from roles.operations.driver import reboot_reasons
from roles.operations.status import gathered, recorded

__all__ = ["HostStatus", "apply", "closures", "host_summary", "render", "summaries"]

SUMMARY_ENV = "GLM_FLASH_SUMMARY_JSON"
_STATE: list = []  # pyinfra's State of this run, kept for the exit hook (which runs outside its context)


def endpoint(listen_host: str, port: int, address: str, scheme: str = "http") -> str:
    """Where clients reach a server listening on listen_host:port of the host known as `address`."""
    where = address if listen_host in ("0.0.0.0", "::", "") else listen_host
    return f"{scheme}://{where}:{port}/v1"


def fleet_network(profile: Profile) -> str:
    """What the fleet's own traffic crosses, as the inventory decided it (control/fleet.py refuses a
    fleet off loopback unless the operator says its network is private)."""
    if profile.fleet_network_private:
        return (
            "private, by the operator's word (fleet_network_private): the gateway's requests with the worker "
            "key and the peer transfers cross it unencrypted"
        )
    return "loopback: the fleet's machines talk to each other on this machine only"


def host_summary(planned: dict, status: dict, reboot: list[str]) -> dict:
    """One host's summary from its profile values and what `glm-flash status --json` said."""
    items = {it["item"]: it for it in status.get("items", [])}

    def detail(name: str) -> str:
        it = items.get(name)
        return f"{it['state']}: {it['detail']}" if it else "not reported"

    def field(name: str, key: str):  # a value the status tool emits as a field, never parsed from its detail
        return items.get(name, {}).get("fields", {}).get(key)

    return {
        **planned,
        "serving": items.get("readiness", {}).get("state") == "ok",
        "service": detail("service"),
        "readiness": detail("readiness"),
        "environment": field("engine", "current"),
        "engine": detail("engine"),
        "model_commit": field("model", "commit"),
        "model": detail("model"),
        "driver": detail("driver"),
        "toolkit": detail("cuda toolkit"),
        "closure": field("closure", "closure"),
        "closure_parts": field("closure", "parts") or {},
        "reboot_pending": reboot,
        "last_failure": detail("last failure"),
        "last_failure_lines": items.get("last failure", {}).get("lines", []),
        "problems": [f"{it['item']}: {it['detail']}" for it in items.values() if it["state"] == "problem"],
    }


def summaries() -> dict[str, dict]:
    """Every host of the run: its summary, or why it has none."""
    run = _STATE[0] if _STATE else None
    record = run_record.of(run)
    # The hosts this run was for (not those --limit left out), unreachable ones included: those
    # that never answered are not activated, only failed.
    hosts = (
        {h.name: h for h in run.inventory if h in run.activated_hosts or h in run.failed_hosts}
        if run
        else dict.fromkeys(record.planned)
    )
    failed = {h.name for h in run.failed_hosts} if run else set()
    gone = {name: unreachable(h) for name, h in hosts.items() if name in failed and not record.refused.get(name)}
    out = {}
    for name in hosts:
        s = dict(record.gathered.get(name) or record.planned.get(name, {}))
        s["skipped"] = [{"step": step, "reason": why} for step, why in record.skipped.get(name, [])]
        s["refused"] = record.refused.get(name, [])
        seed = record.seeded_by.get(name)
        if gone.get(name):
            s["result"] = f"unreachable: {gone[name]} (the other hosts went on without it)"
        elif name in failed and gone.get(seed):
            s["result"] = (
                f"failed: it was to receive files from the fleet's seed {seed}, which became unreachable "
                "before it sent them; deploy again (a reached worker becomes the seed)"
            )
        elif name in failed:
            s["result"] = "refused" if s["refused"] else "failed (see the errors above)"
        elif name in record.gathered:
            s["result"] = "deployed"
        else:
            s["result"] = "not run to the end (dry run, or stopped before the last operation)"
        out[name] = s
    return out


def closures(all_hosts: dict[str, dict]) -> list[str]:
    """The hosts grouped by closure hash (roles' `glm-flash closure`), and every host whose closure
    differs from the one most hosts have, with the parts that differ: `node3 drifted from sha256:... in: unit`."""
    groups: dict[str, list[str]] = {}
    for name, s in all_hosts.items():
        if s.get("closure"):
            groups.setdefault(s["closure"], []).append(name)
    if not groups:
        return []
    # The closure most hosts share (on a tie, the first host's in the inventory's order).
    common = max(groups, key=lambda c: len(groups[c]))
    lines = [f"{c}: {', '.join(names)}" for c, names in groups.items()]
    parts = all_hosts[groups[common][0]].get("closure_parts", {})
    for c, names in groups.items():
        if c == common:
            continue
        for name in names:
            mine = all_hosts[name].get("closure_parts", {})
            differ = [p for p in sorted(set(parts) | set(mine)) if parts.get(p) != mine.get(p)]
            lines.append(f"{name} drifted from {common} in: {', '.join(differ) or 'unknown'}")
    return lines


def unreachable(h) -> str:
    """Why SSH to this host does not answer now (a host that went away mid-run), or ""."""
    data = h.data.dict() if h is not None else {}
    if h is None or (h.connector_cls.__name__ != "SSHConnector"):
        return ""
    where = (data.get("ssh_hostname") or h.name, int(data.get("ssh_port") or 22))
    try:
        socket.create_connection(where, timeout=5).close()
    except OSError as e:
        return f"SSH to {where[0]}:{where[1]} does not answer ({e.strerror or e})"
    return ""


def render(all_hosts: dict[str, dict]) -> str:
    lines = ["", "--> Summary"]
    for name, s in all_hosts.items():
        lines.append(f"    [{name}] {s['result']}")
        for reason in s["refused"]:
            lines.append(f"        refused: {reason}")
        for key in (
            "endpoint",
            "model_name",
            "workers",
            "serving",
            "service",
            "readiness",
            "engine_set",
            "weights",
            "environment",
            "engine",
            "fleet_network",
        ):
            if key in s:
                lines.append(f"        {key}: {s[key]}")
        for key in ("model_commit", "model", "driver_branch", "driver", "toolkit", "reboot_pending"):
            if key in s:
                lines.append(f"        {key}: {s[key] if s[key] not in ([], None) else 'none'}")
        if s.get("last_failure"):
            lines.append(f"        last_failure: {s['last_failure']}")
        for line in s.get("last_failure_lines", [])[-10:]:
            lines.append(f"            {line}")
        for p in s.get("problems", []):
            lines.append(f"        problem: {p}")
        for sk in s["skipped"]:
            lines.append(f"        skipped: {sk['step']}: {sk['reason']}")
    grouped = closures(all_hosts)
    if grouped:
        lines.append("--> Closures (what each host serves and how: `glm-flash closure`)")
        lines.extend(f"    {line}" for line in grouped)
    return "\n".join(lines)


def _print_at_exit() -> None:
    if not _STATE or not run_record.of(_STATE[0]).planned:
        return
    all_hosts = summaries()
    print(render(all_hosts), file=sys.stderr, flush=True)
    path = os.environ.get(SUMMARY_ENV)
    if path:
        with open(path, "w") as f:
            json.dump({"hosts": all_hosts}, f, indent=1, sort_keys=True)
            f.write("\n")


def _printed_at_exit() -> None:
    run = state_proxy._get_module()
    if isinstance(run, State) and not _STATE:  # a pyinfra run (not a plan test): print when it ends
        _STATE.append(run)
        atexit.register(_print_at_exit)


def gateway_apply(profile: Profile, address: str) -> None:
    """The fleet's gateway in the summary: the endpoint clients use (TLS, the fleet's authority) and
    the workers behind it, recorded by the gateway's last operation."""
    _printed_at_exit()
    record = run_record.current()
    record.planned[host.name] = {
        "endpoint": endpoint(profile.gateway_listen_host, profile.gateway_port, address, "https")
        + " (TLS: the fleet's authority's ca.crt)",
        "workers": ", ".join(profile.gateway_workers),
    }
    recorded(name="Summary: what this gateway serves", planned=record.planned[host.name], into=record.gathered)


def apply(profile: Profile) -> None:
    _printed_at_exit()
    record = run_record.current()
    record.planned[host.name] = {
        "endpoint": endpoint(profile.listen_host, profile.port, host.data.dict().get("ssh_hostname") or host.name),
        "model_name": profile.served_model_name,  # what clients send as "model" (README, Using the endpoint)
        "engine_set": profile.on_platform.engine_build(profile),
        "weights": profile.on_platform.weights,
        "driver_branch": profile.driver_branch if profile.driver_source == "nvidia-repo" else profile.driver_source,
        "cuda_version": profile.cuda_version,
        "model_id": profile.model_id,
        "model_revision": profile.model_revision,
    }
    if profile.fleet_peer_port:  # a fleet's worker (control/fleet.py sets the port on every one)
        record.planned[host.name]["fleet_network"] = fleet_network(profile)
    gathered(
        name="Summary: what this host serves now",
        tool=layout.tool(profile, "glm-flash"),
        planned=record.planned[host.name],
        into=record.gathered,
        reboot=reboot_reasons if profile.driver_source != "preinstalled" else None,
        summarize=host_summary,
    )
