"""A fleet: worker nodes of one profile serving the same thing, and optionally a gateway.

    from control.fleet import fleet
    workers, gateway = fleet(shared={...}, workers=[(name, {...}), ...], gateway=(name, {...}))

In an inventory the two lists become pyinfra's groups `workers` and `gateway`. `shared` holds the
group-level values (the model commit, the engine set, ...): they are merged into every worker, so
every worker serves the same thing by construction. A worker entry that sets one of them itself to
something else, or a fleet whose resolved workers would still serve different things, is refused
while the inventory loads, before any host is contacted, like every other profile mistake.
"""

from __future__ import annotations

import ipaddress
import os
import re
from typing import Any

from control.connection import is_pyinfra_key, looks_like_pyinfra_key
from control.defaults import ENV_NAME, HOST_PATH, KNOBS, LISTEN, URL, Knob
from control.inventory_checks import first_contact, placeholders
from control.knob_check import set_values
from control.profile import Problem, Profile, ProfileError, build, checked, fail, for_current_host, hosts
from control.rules import LOOPBACK

WORKERS, GATEWAY = "workers", "gateway"
# What a client of the gateway gets from a worker: these resolve to the same value on every worker.
SERVED = (
    "platform",
    "engine_set",
    "python_release",
    "model_id",
    "model_revision",
    "served_model_name",
    "vllm_ref",
    "deepgemm_ref",
    "drafter_model",
    "drafter_revision",
    "tool_call_parser",
    "reasoning_parser",
    "context_length",
    "max_model_len",
    "kv_cache_dtype",
    "api_key_env",
)
# During a deploy the seed worker serves the fleet's artifacts to its peers here (roles/fleet/artifacts.py).
PEER_PORT = 30080
ANY = ("0.0.0.0", "::")

K = Knob
# The gateway host's settings (it runs no engine, so the node knobs of control/defaults.py do not apply).
GATEWAY_KNOBS: dict[str, Knob] = {
    "gateway_listen_host": K(
        "0.0.0.0", "clients reach the fleet here (TLS, the front door); the API key guards it", **LISTEN
    ),
    "gateway_port": K(
        30000, "the same port a single node serves on, so clients change only the host", int, low=1024, high=65535
    ),
    "gateway_policy": K(
        "cache_aware",
        "SGLang keeps a prefix (radix) cache per worker: send a prompt where its prefix already is",
        choices=("cache_aware", "round_robin", "power_of_two", "random"),
    ),
    "gateway_balance_abs_threshold": K(
        64, "cache-aware routing balances load once workers differ by this many requests (router default)", int, low=1
    ),
    "gateway_balance_rel_threshold": K(
        1.5, "... and the busiest has this many times the requests of the idlest (router default)", float, low=1.0
    ),
    "gateway_health_interval_s": K(5, "how often each worker's /health is asked", int, low=1, high=3600),
    "gateway_health_timeout_s": K(3, "a /health slower than this counts as a failure", int, low=1, high=600),
    "gateway_health_failures": K(2, "failed checks in a row that take a worker out", int, low=1, high=100),
    "gateway_health_successes": K(2, "good checks in a row that put it back", int, low=1, high=100),
    "gateway_breaker_failures": K(
        10, "failed requests to a worker that open its circuit breaker: no traffic until it is half-open", int, low=1
    ),
    "gateway_breaker_open_s": K(
        60, "how long an open breaker keeps a worker out, even once its health checks pass again", int, low=1
    ),
    "gateway_dir": K("/opt/glm-flash-gateway", "the router's environment and its wheels", **HOST_PATH),
    "gateway_workers": K([], "worker URLs; filled in by control.fleet.fleet() from the worker entries", list, **URL),
    "gateway_metrics_port": K(
        29000,
        "the router's own Prometheus port (sglang-router's default), on gateway_listen_host",
        int,
        low=1024,
        high=65535,
    ),
    "gateway_router_port": K(
        30001,
        "the router's own port, on the gateway's loopback only: the front door (nginx) forwards the OpenAI "
        "routes and /health to it, and nothing else reaches it (its /workers API among them)",
        int,
        low=1024,
        high=65535,
    ),
    "gateway_tls_names": K(
        [],
        "DNS names clients reach the gateway by: its certificate (from the fleet's authority on the control "
        "machine) names these, the gateway's address and gateway_listen_host",
        list,
        **LISTEN,
    ),
    "gateway_max_request_mb": K(
        16,
        "the largest request body the front door takes (413 beyond): a full 204,800-token context as JSON "
        "text with room for escapes",
        int,
        low=1,
        high=1024,
    ),
    "gateway_requests_per_s": K(
        20,
        "requests per second one client address may make (a second's worth at once; 429 beyond)",
        int,
        low=1,
        high=100000,
    ),
    "api_key_env": KNOBS["api_key_env"],
    "fleet_network_private": KNOBS["fleet_network_private"],
    "worker_key_env": K(
        "GLM_FLASH_WORKER_KEY",
        "control-machine variable holding the gateway-to-worker key: workers accept only it, never the clients' key",
        **ENV_NAME,
    ),
    # Word when the gateway fails (roles/watch.py), as on a worker.
    "notify_command": KNOBS["notify_command"],
    "notify_webhook_env": KNOBS["notify_webhook_env"],
    "notify_journal_lines": KNOBS["notify_journal_lines"],
}


WORKER_KEY_ENV = GATEWAY_KNOBS["worker_key_env"].default
# A key goes in an HTTP header and a credential file: printable ASCII without spaces.
KEY_SHAPE = re.compile(r"[!-~]{16,4096}")


def key_problems(gateway: str, data: dict[str, Any]) -> list[Problem]:
    """The gateway-to-worker key: set, of a key's shape, and not the clients' key (a worker that
    held the clients' key could be used as the fleet's front door). Read from the control machine's
    environment, never shown."""
    client_env = data.get("api_key_env", KNOBS["api_key_env"].default)
    worker_env = data.get("worker_key_env", WORKER_KEY_ENV)
    worker_key, client_key = os.environ.get(worker_env, ""), os.environ.get(client_env, "")
    fix = (
        f"export {worker_env}=$(openssl rand -hex 32) on the control machine (a key of its own, kept like {client_env})"
    )
    if not worker_key:
        problem = "is not set: workers behind a gateway accept only their own key"
    elif worker_key == client_key:
        problem = f"is the clients' key ({client_env}): a worker would hold it"
    elif not KEY_SHAPE.fullmatch(worker_key):
        problem = "is not 16 to 4096 printable characters without spaces (its value is not shown)"
    else:
        return []
    return [Problem(gateway, worker_env, problem, fix)]


def is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return False


def worker_address(name: str, data: dict[str, Any]) -> str:
    """The host part of worker_url()."""
    listen = data.get("listen_host", KNOBS["listen_host"].default)
    return str(data.get("ssh_hostname") or name if listen in ANY else listen)


# How the fleet's engines restart (roles/fleet/roll.py): one value for every worker.
ROLLED = ("roll_batch", "roll_drain_s")


def _served(profile: Profile) -> dict[str, Any]:
    return {k: getattr(profile, k) for k in (*SERVED, *ROLLED)}


def peer_address(name: str, data: dict[str, Any]) -> str:
    """Where the fleet's other workers reach this one (its peer file server): `fleet_address`, else
    where the gateway reaches it."""
    return str(data.get("fleet_address") or worker_address(name, data))


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return address == "localhost"


def network_problems(
    shared: dict[str, Any], merged: list[tuple[str, dict[str, Any]]], gateway: tuple[str, dict[str, Any]] | None
) -> list[Problem]:
    """No default sends the worker key or the checkpoint in clear over a network the repo does not
    know. The fleet's own traffic (the gateway to each worker, the workers' peer transfers) is not
    encrypted: when any of its addresses is off loopback, the operator says the network is private."""
    problems = [
        Problem(
            name, "fleet_network_private", "is set per worker", "set it once in shared= (it is the fleet's network)"
        )
        for name, data in merged
        if "fleet_network_private" in data and "fleet_network_private" not in shared
    ]
    if shared.get("fleet_network_private") is True:
        return problems
    talk = []
    if gateway is not None:
        talk += [str(gateway[1].get("ssh_hostname") or gateway[0]), *(worker_address(n, d) for n, d in merged)]
    if len(merged) > 1:
        talk += [peer_address(n, d) for n, d in merged]
    off = sorted({a for a in talk if not _loopback(a)})
    if off:
        shown = ", ".join(off[:4]) + (f" and {len(off) - 4} more" if len(off) > 4 else "")
        problems.append(
            Problem(
                "(shared)",
                "fleet_network_private",
                f"is not True, and the fleet's machines talk over {shown}: the gateway's requests to the workers "
                "carry the worker key, and the peer transfers the checkpoint, unencrypted",
                "if that network is the fleet's alone (its own switch or VLAN), set fleet_network_private: True "
                "in shared=; if not, put the fleet on such a network (fleet_address per worker, the workers' "
                "and the gateway's addresses on it): the fleet has no encrypted transport between its machines "
                "(docs/fleet.md, The fleet's network)",
            )
        )
    return problems


def worker_url(name: str, data: dict[str, Any]) -> str:
    """Where the gateway reaches a worker: its listen address, or its SSH address when it listens on all."""
    where = worker_address(name, data)
    port = data.get("port", KNOBS["port"].default)
    return f"http://[{where}]:{port}" if ":" in str(where) else f"http://{where}:{port}"


def fleet_problems(
    shared: dict[str, Any], workers: list[tuple[str, dict[str, Any]]], has_gateway: bool
) -> list[Problem]:
    """Mistakes that make workers serve different things, or a gateway unable to reach them."""
    problems = [
        Problem("(shared)", key, "is not a node setting", "control/defaults.py lists them")
        for key in shared
        if key not in KNOBS or is_pyinfra_key(key) or looks_like_pyinfra_key(key)
    ]
    once = "set it once in shared= (every worker serves the same thing), not per worker"
    for name, data in workers:
        problems += [
            Problem(name, key, f"{value!r} differs from the fleet's shared {shared[key]!r}", once)
            for key, value in data.items()
            if key in shared and value != shared[key]
        ]
    if not workers:
        problems.append(Problem("(fleet)", "workers", "is empty", "list at least one worker"))
    merged = [(name, {**data, **shared}) for name, data in workers]
    seen: dict[str, str] = {}
    not_ip = "set the worker's IP address on the fleet's private network, or leave it unset (its SSH address)"
    own = "give every worker its own address (set fleet_address per worker, not in shared=)"
    for name, data in merged:
        where = data.get("fleet_address")
        if not where or not isinstance(where, str):
            continue
        if not is_ip(where):
            problems.append(Problem(name, "fleet_address", f"{where!r} is not an IP address", not_ip))
        elif where in seen:  # seen may record a name too: a name never gets here
            problems.append(Problem(name, "fleet_address", f"{where} is also {seen[where]}'s", own))
        seen.setdefault(where, name)
    revision = merged[0][1].get("model_revision", KNOBS["model_revision"].default) if merged else ""
    downloads = any(d.get("model_download", KNOBS["model_download"].default) for _, d in merged)
    if len(merged) > 1 and downloads and not re.fullmatch(r"[0-9a-f]{40}", str(revision)):
        moves = f"{revision!r} moves: workers downloading at different times would serve different checkpoints"
        pin = "pin the checkpoint's 40-character commit in shared= (the hub's model page, 'Files', commit)"
        problems.append(Problem("(shared)", "model_revision", moves, pin))
    profiles = []
    for name, data in merged:
        problems.extend(first_contact(name, data))
        try:
            profiles.append(build(name, data))
        except ProfileError as e:
            problems.extend(e.problems)
    first = _served(profiles[0]) if profiles else {}
    same = "give every worker the same value (in shared=)"
    problems += [
        Problem(p.host, key, f"resolves to {value!r} but {profiles[0].host} serves {first[key]!r}", same)
        for p in profiles[1:]
        for key, value in _served(p).items()
        if value != first[key]
    ]
    loopback = "the worker listens on loopback only, so the gateway cannot reach it"
    reach = "set listen_host to the address the gateway reaches it on (with GLM_FLASH_API_KEY exported)"
    problems += [
        Problem(name, "listen_host", loopback, reach)
        for name, data in merged
        if has_gateway and data.get("listen_host", KNOBS["listen_host"].default) in LOOPBACK
    ]
    return problems


def _not_a_gateway_setting(name: str, key: str) -> Problem:
    return Problem(name, key, "is not a gateway setting", "control/fleet.py GATEWAY_KNOBS lists them")


def gateway_profile(name: str, data: dict[str, Any]) -> Profile:
    """The gateway host's settings: GATEWAY_KNOBS defaults, then its inventory data."""
    values = {k: knob.default for k, knob in GATEWAY_KNOBS.items()}
    mine = {k: v for k, v in data.items() if not (is_pyinfra_key(k) or looks_like_pyinfra_key(k))}
    problems = set_values(name, GATEWAY_KNOBS, mine, values, unknown=_not_a_gateway_setting)
    ports = {k: values[k] for k in ("gateway_port", "gateway_router_port", "gateway_metrics_port")}
    for key in ("gateway_router_port", "gateway_metrics_port"):
        if not problems and list(ports.values()).count(ports[key]) > 1:
            problems.append(
                Problem(
                    name, key, f"{ports[key]} is also another of the gateway's ports ({ports})", "give each its own"
                )
            )
            break
    if not problems and not values["gateway_workers"]:
        problems.append(Problem(name, "gateway_workers", "is empty", "list the fleet's workers in fleet(workers=...)"))
    if not problems and values["gateway_listen_host"] not in LOOPBACK and not os.environ.get(values["api_key_env"]):
        problems.append(
            Problem(
                name,
                "gateway_listen_host",
                f"{values['gateway_listen_host']} exposes the gateway without an API key",
                f"export {values['api_key_env']} on the control machine, or set gateway_listen_host: 127.0.0.1",
            )
        )
    if problems:
        raise ProfileError(problems)
    return Profile(name, values)


FLEET_SET = ("fleet_gateway_address", "fleet_own_address", "fleet_peer_port")


def behind_gateway(
    shared: dict[str, Any], workers: list[tuple[str, dict[str, Any]]], gateway: tuple[str, dict[str, Any]] | None
) -> tuple[list[Problem], list[tuple[str, dict[str, Any]]]]:
    """What the fleet sets on each worker: the peer port its engine may not bind; behind a gateway
    also the worker key's variable (api_key_env: the worker's engine holds only that key) and the
    addresses its engine unit lets in (its own, the gateway's). Those must be IP addresses
    (systemd's IPAddressAllow= takes no names). The gateway takes shared api_key_env for itself."""
    problems: list[Problem] = []
    out = []
    gname, gdata = gateway if gateway is not None else ("", {})
    if gateway is not None:
        problems += key_problems(gname, {**gdata, **{k: v for k, v in shared.items() if k == "api_key_env"}})
        gaddr = str(gdata.get("ssh_hostname") or gname)
        if not is_ip(gaddr):
            key = "ssh_hostname" if gdata.get("ssh_hostname") else "(host name)"
            allow = f"{gaddr!r} is a name: the workers' engine units let the gateway in by address (IPAddressAllow=)"
            fix = "give the gateway's ssh_hostname as the IP address the workers see its connections from"
            problems.append(Problem(gname, key, allow, fix))
    by_fleet = "remove it from the worker's entry (the worker key's variable is the gateway's worker_key_env)"
    for name, data in workers:
        extra: dict[str, Any] = {"fleet_peer_port": PEER_PORT}
        problems += [
            Problem(name, key, "is set by the fleet, not per worker", by_fleet)
            for key in FLEET_SET + (("api_key_env",) if gateway is not None else ())
            if key in data
        ]
        if gateway is not None:
            own = worker_address(name, {**data, **shared})
            if not is_ip(own):
                allow = f"{own!r} is a name: the worker's engine unit lets in its own address (IPAddressAllow=)"
                fix = "give the worker's ssh_hostname (or listen_host) as its IP address"
                problems.append(Problem(name, "ssh_hostname", allow, fix))
            extra.update(
                api_key_env=gdata.get("worker_key_env", WORKER_KEY_ENV),
                fleet_gateway_address=gaddr if is_ip(gaddr) else "",
                fleet_own_address=own if is_ip(own) else "",
            )
        out.append((name, {**data, **extra}))
    return problems, out


def fleet(
    shared: dict[str, Any],
    workers: list[tuple[str, dict[str, Any]]],
    gateway: tuple[str, dict[str, Any]] | None = None,
) -> tuple[list, list]:
    """Inventory helper: (workers, gateway) host lists, checked before any host is contacted."""
    malformed = [e for e in workers if not (isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], dict))]
    if malformed:
        hosts(*malformed)  # says what is wrong with each and exits
    problems, workers = behind_gateway(shared, workers, gateway)
    if gateway is not None:
        shared = {k: v for k, v in shared.items() if k != "api_key_env"}  # the clients' key: the gateway's
    problems += fleet_problems(shared, workers, gateway is not None)
    merged = [(name, {**data, **shared}) for name, data in workers]
    problems += network_problems(shared, merged, gateway)
    for name, data in merged + ([gateway] if gateway else []):
        problems.extend(placeholders(name, data))
    if gateway is not None:
        name, data = gateway
        data = {**data, "gateway_workers": [worker_url(n, d) for n, d in merged]}
        if "fleet_network_private" in shared:  # the gateway's summary and profile say it too
            data["fleet_network_private"] = shared["fleet_network_private"]
        problems.extend(first_contact(name, data))
        if name in {n for n, _ in merged}:
            problems.append(
                Problem(name, "(name)", "is both a worker and the gateway", "give the gateway its own host")
            )
        try:
            gateway_profile(name, data)
        except ProfileError as e:
            problems.extend(e.problems)
        gateway = (name, data)
    if problems:
        fail(ProfileError(problems))
    if gateway:
        checked([gateway])  # checked above against the gateway's own knobs, not a node's
    # hosts() also checks the entries' shape and names given twice.
    return hosts(*merged), [gateway] if gateway else []


def gateway_for_current_host() -> Profile:
    """The current pyinfra host's gateway settings (after --data overrides); exits cleanly on mistakes."""
    return for_current_host(gateway_profile)
