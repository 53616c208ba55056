"""glm-flash.service: unit, environment and launch spec rendered from the profile."""

from __future__ import annotations

import json
import os
from io import StringIO

from pyinfra import host
from pyinfra.operations import files, systemd
from pyinfra.operations.util import any_changed

from control.layout import SECRETS_DIR, bin_dir
from control.layout import service_home as state_dir
from control.profile import Profile
from control.report import skipped
from roles import launch
from roles.facts.system import Gpus, NumaNodes
from roles.operations.secrets import Secret, secret_file
from roles.operations.uploads import template

UNIT = "/etc/systemd/system/glm-flash.service"
CONF_DIR = "/etc/glm-flash"


def unit_context(profile: Profile, api_key: bool) -> dict:
    return dict(
        engine="KTransformers + SGLang-kt" if profile.platform == "l40s" else "vLLM",
        service_user=profile.service_user,
        state_dir=state_dir(profile),
        bin=bin_dir(profile),
        alloc_conf=profile.pytorch_alloc_conf,
        api_key=api_key,
        gpu_count=profile.gpu_count,
        port=profile.port,
        served_model_name=profile.served_model_name,
        startup_timeout_s=profile.startup_timeout_s,
        restart_limit=profile.restart_limit,
        restart_window_s=profile.restart_window_s,
        drop_page_cache=profile.drop_page_cache,
    )


def engine_env(profile: Profile) -> dict[str, str]:
    if profile.platform == "l40s":
        return launch.kt_env(profile)
    if profile.platform == "gb10":
        from roles.vllm_launch import vllm_env

        return vllm_env(profile)
    return {}


def apply(profile: Profile, engine_switch=None) -> None:
    """engine_switch: the op that moved the engine's `current` link; the service restarts after it."""
    api_key = os.environ.get(profile.api_key_env, "")
    readable = dict(user="root", group=profile.service_user, mode="640")
    files.directory(name="Configuration directory", path=CONF_DIR, user="root", group=profile.service_user, mode="750")
    env = template(
        "glm-flash.env.j2",
        f"{CONF_DIR}/glm-flash.env",
        name="Service environment",
        state_dir=state_dir(profile),
        extra_env=engine_env(profile),
        **readable,
    )
    spec = launch.launch_spec(profile, host.get_fact(NumaNodes))
    launch_file = files.put(
        name="Launch flags", src=StringIO(json.dumps(spec, indent=2) + "\n"), dest=f"{CONF_DIR}/launch.json", **readable
    )
    if api_key:
        # Read by systemd as a credential; only root can read the file itself.
        key = secret_file(
            name="API key (from the control machine's environment; compared by hash, never shown)",
            secret=Secret(api_key),
            dest=f"{CONF_DIR}/api-key",
            stage_dir=SECRETS_DIR,
        )
    else:
        key = files.file(name="No API key configured", path=f"{CONF_DIR}/api-key", present=False)
    unit = template("glm-flash.service.j2", UNIT, name="glm-flash.service unit", **unit_context(profile, bool(api_key)))
    changed = any_changed(*[op for op in (env, launch_file, key, unit, engine_switch) if op is not None])
    systemd.daemon_reload(name="Reload systemd after the unit changed", _if=any_changed(unit))
    if not host.get_fact(Gpus):
        systemd.service(name="Enable glm-flash.service", service="glm-flash.service", enabled=True, running=None)
        skipped(
            "start glm-flash.service",
            "no NVIDIA GPU on this host; the unit is enabled and its preflight refuses to start the engine",
        )
        return
    # Starting blocks until a real completion answers (ExecStartPost), up to startup_timeout_s.
    systemd.service(name="Enable and start glm-flash.service", service="glm-flash.service", enabled=True, running=True)
    # pyinfra restarts only a unit that was already running before this run.
    systemd.service(
        name="Restart glm-flash.service after its configuration or engine changed",
        service="glm-flash.service",
        running=None,
        restarted=True,
        _if=changed,
    )
