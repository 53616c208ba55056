"""glm-flash.service: unit, environment and launch spec rendered from the profile."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from io import StringIO

from pyinfra import host

from control import run_record
from control.layout import (
    API_KEY,
    CONF_DIR,
    ENV_FILE,
    GPU_UNIT,
    LAUNCH_SPEC,
    PATCH_SET_DIR,
    SECRETS_DIR,
    UNIT,
    bin_dir,
    engine_python,
    engine_root,
)
from control.layout import service_home as state_dir
from control.profile import Profile
from control.report import skipped
from pyinfra_ext import memo
from roles.facts.service import SystemdVersion
from roles.facts.system import Gpus
from roles.operations import paths, units
from roles.operations.secrets import Secret, secret_file
from roles.operations.service_restart import started_from_disk
from roles.operations.uploads import template

# A log line carrying an API key value (`api_key='...'`, `"api-key": "..."`, but not None or
# vLLM's redacted '***') or a bearer token. PCRE2, as LogFilterPatterns= takes it.
KEY_LOG_PATTERN = r"""(?i)(api[_-]?key["']?\s*[:=]\s*(?!None\b|["']\*+["'])\S|\bBearer\s+\S)"""
LOG_FILTER_SYSTEMD = 253  # LogFilterPatterns= (systemd.exec(5), "Added in version 253")
# In each engine environment: the launch spec and environment file written for it, the ones its
# own parser accepted; glm-flash-rollback puts them back with the environment (files/glm-flash-engine).
SERVICE_RECORD = ".glm-flash-service"


@dataclass(frozen=True)
class EngineResult:
    """What an engine role deployed (roles/engines/): the service runs exactly this."""

    env: str  # <engine_set>-<hash> or vllm-moet-<ref12>-<hash>
    env_dir: str  # install_root/engine/envs/<env>
    launch_spec: dict  # what the service runs: python is current/bin/python, the flags the engine's parser accepted
    service_env: dict  # the engine's environment variables in the unit's environment file


def command_line(flags: dict) -> list[str]:
    """A command line from {flag: value}, in their order: a value of None is a flag alone."""
    return [a for flag, value in flags.items() for a in ((flag,) if value is None else (flag, str(value)))]


def state_directory(profile: Profile) -> str:
    """The service's state directory as StateDirectory= takes it: relative to /var/lib (where
    control/layout.py service_home puts it)."""
    return state_dir(profile).removeprefix("/var/lib/")


def unit_context(profile: Profile, api_key: bool, systemd_version: int = LOG_FILTER_SYSTEMD) -> dict:
    return dict(
        engine=profile.on_platform.engine_label,
        service_user=profile.service_user,
        state_dir=state_dir(profile),
        state_directory=state_directory(profile),
        bin=bin_dir(profile),
        engine_python=engine_python(profile),
        tp_size=profile.tp_size,
        alloc_conf=profile.pytorch_alloc_conf,
        api_key=api_key,
        gpu_count=profile.gpu_count,
        port=profile.port,
        listen_host=profile.listen_host,
        served_model_name=profile.served_model_name,
        startup_timeout_s=profile.startup_timeout_s,
        restart_limit=profile.restart_limit,
        restart_window_s=profile.restart_window_s,
        drop_page_cache=profile.drop_page_cache,
        memory_guard=bool(profile.memory_guard_gib),
        log_filter=systemd_version >= LOG_FILTER_SYSTEMD,
        key_log_pattern=KEY_LOG_PATTERN,
        ip_allow=ip_allow(profile),
        peer_port=profile.fleet_peer_port,
    )


def tp_env(profile: Profile) -> dict[str, str]:
    """NCCL's and Gloo's sockets between the TP workers of this one engine on loopback. Tensor
    parallelism never leaves the host here (tp_size is at most the host's own GPUs), and by default
    NCCL binds its unauthenticated bootstrap to the first interface that is not lo or docker*
    (docs/sources.md §15): the LAN, even when the API listens on 127.0.0.1. Behind the address
    filter of a fleet worker (ip_allow) loopback is also what the filter lets in."""
    return {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}


def ip_allow(profile: Profile) -> list[str]:
    """Who may talk to the engine (IPAddressAllow=, with IPAddressDeny=any), for a fleet worker
    behind a gateway: loopback, its own address, the gateway's, then engine_allow_from. Empty
    (no filter) for a single node, whose clients come from anywhere the API key lets in."""
    if not profile.fleet_gateway_address:
        return []
    ours = ["localhost", profile.fleet_own_address, profile.fleet_gateway_address, *profile.engine_allow_from]
    return list(dict.fromkeys(a for a in ours if a))


def start_inputs(profile: Profile) -> list[str]:
    """What a start of the service reads: its units, environment, flags, key, and the engine."""
    current = f"{engine_root(profile)}/current"
    return [
        UNIT,
        GPU_UNIT,
        ENV_FILE,
        LAUNCH_SPEC,
        API_KEY,
        current,  # the link itself: its mtime is when the engine was switched
        f"{current}/{PATCH_SET_DIR}",  # the engine patch sets (replaced when the edits change)
    ]


def apply(profile: Profile, engine: EngineResult) -> None:
    """engine: what the engine role deployed: the launch spec its engine's parser accepted and its
    environment variables. The restart compares the service's last start with the `current` link
    and the files on disk (roles/operations/service_restart.py), not with what this run changed."""
    api_key = os.environ.get(profile.api_key_env, "")
    readable = dict(user="root", group=profile.service_user, mode="640")
    paths.directory(CONF_DIR, user="root", group=profile.service_user, mode="750", name="Configuration directory")
    record = f"{engine.env_dir}/{SERVICE_RECORD}"
    paths.directory(record, user="root", group="root", mode="700", name=f"Launch record of {engine.env}")
    # The record first: a run killed between the two leaves the environment's own spec recorded.
    for where, owner, what in (
        (record, dict(user="root", group="root", mode="600"), " (rollback record)"),
        (CONF_DIR, readable, ""),
    ):
        template(
            "glm-flash.env.j2",
            f"{where}/glm-flash.env",
            name=f"Service environment{what}",
            state_dir=state_dir(profile),
            extra_env={**engine.service_env, **tp_env(profile)},
            **owner,
        )
        paths.put(
            StringIO(json.dumps(engine.launch_spec, indent=2) + "\n"),
            f"{where}/launch.json",
            name=f"Launch flags{what}",
            **owner,
        )
    if api_key:
        # Read by systemd as a credential; only root can read the file itself.
        secret_file(
            name="API key (from the control machine's environment; compared by hash, never shown)",
            secret=Secret(api_key),
            dest=API_KEY,
            stage_dir=SECRETS_DIR,
        )
    else:
        paths.absent(API_KEY, name="No API key configured")
    template("glm-flash-gpu.service.j2", GPU_UNIT, name="glm-flash-gpu.service unit")
    context = unit_context(profile, bool(api_key), memo.fact(host, SystemdVersion))
    template("glm-flash.service.j2", UNIT, name="glm-flash.service unit", **context)
    # `enable` reloads systemd's unit files itself.
    units.enabled("glm-flash.service", name="Enable glm-flash.service")
    # A profile that needs no GPU (platform cpu: the sandbox's CPU engine) serves without one.
    gpus = bool(memo.fact(host, Gpus)) or profile.gpu_count == 0
    if not gpus:
        skipped(
            "start glm-flash.service",
            "no NVIDIA GPU on this host; a start is tried once when its files changed, and its preflight refuses",
        )
    # Starting blocks until a real completion answers (ExecStartPost), up to startup_timeout_s.
    # In a fleet behind a gateway the restarts roll: roll_batch workers at a time, each out of the
    # gateway meanwhile (roles/fleet/roll.py, registered for the run by deploy_fleet.py).
    roll = run_record.current().engine_roll
    started_from_disk(
        name="glm-flash.service started from the files on disk" + (" (rolling, behind the gateway)" if roll else ""),
        service="glm-flash.service",
        inputs=start_inputs(profile),
        units=["glm-flash.service", "glm-flash-gpu.service"],
        can_serve=gpus,
        roll=roll,
        **({"_parallel": roll.parallel()} if roll else {}),
    )


def rolled_by(roll) -> None:
    """This run's engine restarts roll as `roll` says (its parallel(), command(), put_back()); once per run."""
    record = run_record.current()
    if record.engine_roll is None:
        record.engine_roll = roll
