"""The fleet's one endpoint: SGLang's router (sglang-router, locks/gateway.txt) as a systemd service.

The router runs on the gateway host's Debian python3 in a venv built offline from wheels the
control machine fetched once (checked against the lock's hashes, installed by uv with
--require-hashes: roles/operations/python.py). Health checks of every worker's /health take a dead worker out after
`gateway_health_failures` failed checks and put it back after `gateway_health_successes` good
ones; failed requests are retried on another worker by the router. The API key guards the
router's API (clients'); the workers get their own key (GLM_FLASH_WORKER_KEY), which the router
sends them (each worker is added with it through the router's worker API); both reach the router as a systemd credential
(files/glm-flash-gateway-launch), never on a command line.

The venv the unit runs (`<gateway_dir>/venv`) is a symlink to `venvs/<lock sha>-<random>`. A new
lock is built beside the running environment, marked complete (durably, after a sync), and
only then `venv` is pointed at it in one rename (the first time, when `venv` is still a real
directory, exchanged with the link in one renameat2(RENAME_EXCHANGE)). A kill at any point
leaves `venv` a whole environment, the old one or the new; leftovers are pruned by the next build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from io import StringIO

from pyinfra import host
from pyinfra.api import OperationError
from pyinfra.operations import systemd

from control import fleet_ca, layout
from control.engine_lock import LockError, Target, fetch, parse_lock
from control.profile import Profile, refuse
from control.pypi_cache import FetchError, cache_root
from roles import summary, watch
from roles.operations import packages, paths, python
from roles.operations.gateway import router_env_built, router_lists_only
from roles.operations.secrets import Secret, secret_file
from roles.operations.service_restart import started_from_disk
from roles.operations.uploads import host_tool, template
from roles.service import command_line

LOCK = layout.LOCKS / "gateway.txt"
ROUTER_HOST = "127.0.0.1"
# What clients may ask the fleet: the OpenAI routes the engines serve, and /health. Anything else
# (the router's /workers, /flush_cache, /get_server_info ...) answers 404 at the front door.
ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health")
FRONT_UNIT = layout.FRONT_UNIT.rsplit("/", 1)[1]
FRONT_CONF = f"{layout.GATEWAY_CONF_DIR}/front.conf"
FRONT_CERT = f"{layout.GATEWAY_CONF_DIR}/front.crt"
FRONT_KEY = f"{layout.GATEWAY_CONF_DIR}/front.key"
FLEET_CA_CERT = f"{layout.GATEWAY_CONF_DIR}/fleet-ca.crt"
CONNECTIONS_PER_CLIENT = 64
CONF_DIR = layout.GATEWAY_CONF_DIR
ROUTER_JSON = f"{CONF_DIR}/router.json"  # the router's flags and workers; the keys' files beside it
UNIT = layout.GATEWAY_UNIT
MARKER = ".glm-flash-lock"  # in the venv: the sha256 of the lock it was built from
# The hardening of both its units (the router's, the front door's): one text, written into each
SANDBOX = (layout.TEMPLATES / "glm-flash-gateway-sandbox.conf").read_text()


def router_args(p: Profile) -> list[str]:
    """The router's own flags (everything but the keys), from the gateway settings. No --worker-urls:
    a worker given there gets the router's own key (the clients'), so files/glm-flash-gateway-launch
    adds each worker through the router's worker API (POST /workers {url, api_key}) with the
    gateway-to-worker key."""
    return command_line(
        {
            # Loopback only: the router's worker API (/workers) is guarded by the clients' key, so
            # clients reach it only through the front door (front_conf), which forwards no such route.
            "--host": ROUTER_HOST,
            "--port": p.gateway_router_port,
            "--policy": p.gateway_policy,
            "--balance-abs-threshold": p.gateway_balance_abs_threshold,
            "--balance-rel-threshold": p.gateway_balance_rel_threshold,
            "--health-check-endpoint": "/health",
            "--health-check-interval-secs": p.gateway_health_interval_s,
            "--health-check-timeout-secs": p.gateway_health_timeout_s,
            "--health-failure-threshold": p.gateway_health_failures,
            "--health-success-threshold": p.gateway_health_successes,
            "--cb-failure-threshold": p.gateway_breaker_failures,
            "--cb-timeout-duration-secs": p.gateway_breaker_open_s,
            "--log-level": "warn",
            # The router's own metrics (smg_*), where its API listens (its default is 0.0.0.0:29000).
            "--prometheus-host": p.gateway_listen_host,
            "--prometheus-port": p.gateway_metrics_port,
        }
    )


def tls_names(p: Profile, address: str) -> list[str]:
    """What the gateway's certificate names: the address the fleet reaches it on, the address it
    listens on (when it is one), and the DNS names clients use (gateway_tls_names)."""
    names = [address, "127.0.0.1", *p.gateway_tls_names]  # 127.0.0.1: clients on the gateway itself
    if p.gateway_listen_host not in ("0.0.0.0", "::"):
        names.append(p.gateway_listen_host)
    return sorted(set(names))


def front_conf(p: Profile) -> dict:
    """The front door's nginx settings (templates/glm-flash-front.conf.j2)."""
    return {
        "listen": watch.listen_address(p.gateway_listen_host, p.gateway_port),
        "router": f"{ROUTER_HOST}:{p.gateway_router_port}",
        "cert": FRONT_CERT,
        "key": f"/run/credentials/{FRONT_UNIT}/tls-key",
        "routes": ROUTES,
        "max_body_mb": p.gateway_max_request_mb,
        "requests_per_s": p.gateway_requests_per_s,
        "connections": CONNECTIONS_PER_CLIENT,
    }


def certificate(p: Profile, address: str) -> fleet_ca.Issued:
    """The gateway's certificate from the fleet's authority on the control machine (made or reused
    while the run is planned: a directory that cannot be trusted refuses this host before it is touched)."""
    try:
        return fleet_ca.issue(host.name, tls_names(p, address))
    except fleet_ca.CAError as e:
        refuse("gateway_tls_names" if "names" in e.problem else "GLM_FLASH_FLEET_CA", e.problem, e.fix)


def wheels_for(found: dict | None) -> list[str]:
    """The lock's wheels for the gateway's own python3 as the HostPython fact found it (the lock
    hashes every platform's files: `make gateway-lock`), in a wheelhouse of that target's own in
    the control machine's cache; OperationError (a refusal of this host) when none can be chosen."""
    if found is None:
        raise OperationError(
            f"{host.name}: the gateway host has no python3 to build the router's environment with. "
            "Fix: keep python3 installable from its apt sources, then deploy again"
        )
    try:
        target = Target.of_interpreter(found)
        pins = parse_lock(LOCK.read_text(), str(LOCK))
        files = fetch(pins, dest=cache_root() / "gateway-wheelhouse" / target.name, target=target, wheels_only=True)
    except LockError as e:
        raise OperationError(
            f"{host.name}: locks/gateway.txt: no wheels for the gateway's python3 ({e}). "
            "Fix: run `make gateway-lock` for it, or make the distribution's CPython 3 (glibc, 64-bit) its python3"
        ) from None
    except FetchError as e:
        raise OperationError(f"{host.name}: {e}. Fix: check this machine's access to PyPI, then deploy again") from None
    return [str(w) for w in files]


def venv_commands(d: str, uv: str, launcher: str, wheelhouse: str, lock_dest: str, lock_sha: str) -> list[str]:
    """Build the router's venv from the lock beside the running one (with `uv`, the host's one
    builder: roles/operations/python.py), then swap `d/venv` to it (`launcher swap-venv`)."""
    q = shlex.quote
    venv, venvs = f"{d}/venv", f"{d}/venvs"
    made, installed = python.venv_commands(uv, "$new", wheelhouse, lock_dest)
    return [
        f"mkdir -p {q(venvs)} && rm -rf {q(venv + '.new')} && "  # .new: an older deploy's leftover
        f"new=$(mktemp -d {q(venvs + '/' + lock_sha[:16])}-XXXXXX) && chmod 755 \"$new\" && "
        f"{made} && {installed} && "
        f'find "$new" -type f -exec sync {{}} + && find "$new" -type d -exec sync {{}} + && '
        f'printf "%s\\n" {lock_sha} > "$new"/{MARKER} && sync "$new"/{MARKER} "$new" && '
        f'old=$(readlink -f {q(venv)} || true) && '
        f'python3 {q(launcher)} swap-venv {q(venv)} "$new" && '
        f'for v in {q(venvs)}/*; do [ "$v" = "$new" ] || [ "$v" = "$old" ] || rm -rf "$v"; done',
    ]


def launcher(p: Profile) -> str:
    """files/glm-flash-gateway-launch as the gateway has it: the unit's ExecStart=, the worker API's tool."""
    return f"{p.gateway_dir}/bin/glm-flash-gateway-launch"


def front_door(p: Profile, address: str) -> None:
    """nginx in front of the router: TLS with the fleet's certificate, the OpenAI routes and /health
    only, bounded requests. The fleet's authority's certificate goes beside it (fleet-ca.crt), for
    clients on the gateway and the host checks. Debian's own nginx.service is masked first, before
    the package could start it with its default site on port 80: glm-flash-front.service is the
    only nginx here."""
    issued = certificate(p, address)
    paths.link(path=layout.NGINX_MASK, target="/dev/null", name="Debian's nginx.service masked")
    packages.installed(["nginx"], name="nginx (the front door)", no_recommends=True)
    for what, pem, dest in (
        ("Front door certificate (the fleet's authority)", issued.cert_pem, FRONT_CERT),
        ("The fleet's authority (ca.crt: what clients trust the gateway by)", issued.ca_pem, FLEET_CA_CERT),
    ):
        paths.put(name=what, src=StringIO(pem.decode()), dest=dest, mode="644")
    secret_file(
        name="Front door certificate key (made on the control machine; compared by hash, never shown)",
        secret=Secret(issued.key_pem.decode()),
        dest=FRONT_KEY,
        stage_dir=f"{CONF_DIR}/.staging",
    )
    template("glm-flash-front.conf.j2", FRONT_CONF, name="Front door settings (nginx)", **front_conf(p))
    template(
        "glm-flash-front.service.j2",
        layout.FRONT_UNIT,
        name=f"{FRONT_UNIT} unit",
        conf=FRONT_CONF,
        key_file=FRONT_KEY,
        sandbox=SANDBOX,
    )
    systemd.service(name=f"Enable {FRONT_UNIT}", service=FRONT_UNIT, enabled=True)
    started_from_disk(
        name=f"{FRONT_UNIT} started from the files on disk",
        service=FRONT_UNIT,
        inputs=[layout.FRONT_UNIT, FRONT_CONF, FRONT_CERT, FRONT_KEY],
    )


def apply(p: Profile) -> None:
    api_key = os.environ.get(p.api_key_env, "")
    worker_key = os.environ.get(p.worker_key_env, "")
    d = p.gateway_dir
    venv, wheelhouse, bin_dir, lock_dest = f"{d}/venv", f"{d}/wheelhouse", f"{d}/bin", f"{d}/gateway.txt"
    lock_sha = hashlib.sha256(LOCK.read_bytes()).hexdigest()
    packages.installed(["python3"], name="Python for the gateway", update=True, no_recommends=True)
    for path in (d, wheelhouse, bin_dir):
        paths.directory(name=f"Directory {path}", path=path, user="root", group="root", mode="755")
    uv = f"{bin_dir}/uv"
    python.uv_installed(name=f"uv {uv} (locks/tools.txt; builds the gateway's environment)", dest=uv)
    host_tool("glm-flash-gateway-launch", bin_dir)  # the unit's ExecStart=; its swap-venv ends a build
    paths.put(name="Gateway lock", src=str(LOCK), dest=lock_dest, mode="644")
    router_env_built(
        name="Gateway environment built offline from the lock (hashes checked)",
        venv=venv,
        marker=MARKER,
        lock_sha=lock_sha,
        wheelhouse=wheelhouse,
        wheels_for=wheels_for,
        commands=venv_commands(d, uv, launcher(p), wheelhouse, lock_dest, lock_sha),
    )
    watch.notifier(p.notify_command, p.notify_journal_lines, p.notify_webhook_env)  # OnFailure= of the unit
    paths.directory(name=f"Directory {CONF_DIR}", path=CONF_DIR, user="root", group="root", mode="755")
    paths.put(
        name="Router flags",
        src=StringIO(json.dumps({"args": router_args(p), "workers": p.gateway_workers}, indent=2) + "\n"),
        dest=ROUTER_JSON,
        mode="644",
    )
    for key, file, what in ((api_key, "api-key", " API key"), (worker_key, "worker-key", "-to-worker key")):
        if key:
            # Read by systemd as a credential; only root can read the file itself.
            secret_file(
                name=f"Gateway{what} (from the control machine's environment; compared by hash, never shown)",
                secret=Secret(key),
                dest=f"{CONF_DIR}/{file}",
                stage_dir=f"{CONF_DIR}/.staging",
            )
        else:
            paths.absent(f"{CONF_DIR}/{file}", name=f"No gateway{what} configured")
    template(
        "glm-flash-gateway.service.j2",
        UNIT,
        name="glm-flash-gateway.service unit",
        policy=p.gateway_policy,
        workers=len(p.gateway_workers),
        api_key=bool(api_key),
        worker_key=bool(worker_key),
        conf_dir=CONF_DIR,
        venv=venv,
        bin=bin_dir,
        sandbox=SANDBOX,
    )
    systemd.service(name="Enable glm-flash-gateway.service", service="glm-flash-gateway.service", enabled=True)
    # Decided from the host's state, so a run killed after an upload still restarts it next time.
    started_from_disk(
        name="glm-flash-gateway.service started from the files on disk",
        service="glm-flash-gateway.service",
        inputs=[
            UNIT,
            ROUTER_JSON,
            f"{CONF_DIR}/api-key",
            f"{CONF_DIR}/worker-key",
            launcher(p),
            venv,
        ],
    )
    address = str(host.data.get("ssh_hostname") or host.name)
    front_door(p, address)
    # Workers the inventory does not name, added through the router's API since it started: out.
    router_lists_only(
        name="The router lists the inventory's workers only",
        tool=launcher(p),
        conf=ROUTER_JSON,
        urls=p.gateway_workers,
    )
    summary.gateway_apply(p, address)  # last: a run stopped before it says so
