"""What both engines share: where an environment lives, how it is built beside the serving
one, and the `current` link the service runs through.

An engine role (roles/engines/kt/engine.py on the L40S box, roles/engines/vllm/engine.py on the GB10 box;
deploy.py picks one through roles/engines/dispatch.py) builds its environment under
install_root/engine/envs/<env>, patches it, has its flags checked by its own parser, and only
then moves `current` to it with `current_engine` (the old one stays as `previous` for
glm-flash-rollback; older ones are pruned). It returns an EngineResult: what the service
runs, exactly the launch spec that was checked.

Every decision about the host is an operation (roles/operations/engine.py) reading its
state at run time through files/glm-flash-engine (`status --json`, the EngineEnvs fact).
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from control import layout
from control.engine_lock import LockError, cached, lock_json
from control.profile import Profile, refuse
from control.pypi_cache import FetchError
from control.report import skipped
from control.run import dry_run
from roles import service
from roles.engines import flag_check, interpreter
from roles.operations import paths, sandboxing
from roles.operations.engine import current_engine, environment_built

ENGINE_TOOL = "glm-flash-engine"


@dataclass(frozen=True)
class Upload:
    """A file an engine uploads from the control machine: `src` there, `rel` under install_root
    on the host, with its mode and (when the lock gives it) its sha256."""

    src: Path
    mode: str
    rel: str
    sha256: str | None = None


# What an engine's apply() returns is what the service runs: the service role declares it.
EngineResult = service.EngineResult


def serving_flags(profile: Profile) -> dict:
    """What clients see, the same flags for both engines: the model's name, the address."""
    return {"--served-model-name": profile.served_model_name, "--host": profile.listen_host, "--port": profile.port}


def launch_spec(profile: Profile, module: str, generated: list[str]) -> dict:
    """What files/glm-flash-launch reads: which python, which module, which flags. The API key
    is added in-process (never in argv). The flags: the profile's, then `engine_extra_args` as
    they are. An extra flag the profile already sets (by the same name; an alias of it is refused
    on the host by the engine's own parser, files/glm-flash-check-flags) is refused: two values
    of one setting, one silently lost."""
    owned = {t.split("=", 1)[0] for t in generated if t.startswith("-")} | {"--api-key"}
    taken = [name for t in profile.engine_extra_args if (name := t.split("=", 1)[0]) in owned]
    if taken:
        refuse(
            "engine_extra_args",
            f"{', '.join(taken)} is set by the profile itself",
            "set the knob that owns it instead (make show lists them; docs/knobs.md)",
        )
    return {
        "python": layout.engine_python(profile),
        "module": module,
        "args": [*generated, *profile.engine_extra_args],
        "api_key_flag": "--api-key",
        # only when set: a launch.json without extra flags stays as it was (no restart on upgrade)
        **({"extra_args": list(profile.engine_extra_args)} if profile.engine_extra_args else {}),
    }


def env_dir(profile: Profile, env: str) -> str:
    return f"{layout.engine_root(profile)}/envs/{env}"


def engine_tool(profile: Profile) -> str:
    return layout.tool(profile, ENGINE_TOOL)


def layout_on_host(profile: Profile) -> None:
    """The engine's directories and the rollback command (glm-flash-engine called by that name),
    then the directory of the locks environments are built from."""
    root = layout.engine_root(profile)
    for d in (root, f"{root}/envs"):
        paths.directory(name=f"Directory {d}", path=d, mode="755")
    for link in (layout.tool(profile, "glm-flash-rollback"), f"{layout.SBIN}/glm-flash-rollback"):
        paths.link(name=f"Link {link}", path=link, target=engine_tool(profile))
    paths.directory(name=f"Directory {root}/locks", path=f"{root}/locks", mode="755")


def uploads(art, wheels: list[Path]) -> list[Upload]:
    """What an engine built offline uploads from the control machine: its CPython archive `art`
    and the lock's wheels. The same on every host, installed or not: the archive is kept (0644)
    after it is unpacked (files/glm-flash-engine), so a worker added to a fleet later gets it from
    the others (#22)."""
    archive = Upload(art.path, "644", f"python/.{art.name}.tar.gz", art.sha256)
    return [archive] + [Upload(w, "644", f"engine/wheelhouse/{w.name}") for w in wheels]


def built_offline(
    profile: Profile,
    engine_set: str,
    plan: Callable[[str], tuple[str, list]],
    fetch: Callable[[list], list],
    key: str,
    fixes: tuple[str, str],
    fetched_from: str = "",
) -> tuple[str, list]:
    """The engine's interpreter installed (roles/engines/interpreter.py), then the environment
    `plan(its sha256)` names, (env, pins), built on the host from its hash lock and the control
    machine's wheels (`--no-index`): `fetch(pins)`, or in a dry run only the ones already in the
    cache (the rest is reported, nothing is fetched). The L40S engine's and the sandbox's CPU
    engine's one way to build. A lock or a fetch that fails refuses the host under `key`, with
    `fixes` (the lock's, the fetch's). Returns the environment and its pins."""
    art = interpreter.apply(profile)  # the interpreter the environment is built with
    try:
        env, pins = plan(art.sha256 if art else "")
        if dry_run():
            wheels, missing = cached(pins)
            if missing:
                skipped(
                    f"fetching {len(missing)} of {len(pins)} engine files",
                    f"dry run: the real run fetches them{fetched_from}",
                )
        else:
            wheels = fetch(pins)
    except LockError as e:
        refuse(key, str(e), fixes[0])
    except FetchError as e:
        refuse(key, str(e), fixes[1])
    if art is None:  # a dry run before the interpreter was packed
        env = f"{engine_set}-(interpreter not packed yet)"
    root = layout.engine_root(profile)
    lock_dest, wheelhouse, tool = f"{root}/locks/{env}.json", f"{root}/wheelhouse", engine_tool(profile)
    layout_on_host(profile)
    paths.directory(name=f"Directory {wheelhouse}", path=wheelhouse, mode="755")
    paths.put(name=f"Lock of {env}", src=io.StringIO(lock_json(pins)), dest=lock_dest, mode="644")
    interp = layout.interpreters_dir(profile.install_root)
    host_python = art.host_python(profile.install_root) if art else f"{interp}/(not packed)"
    environment_built(
        name=f"Engine environment {env} built offline ({len(pins)} pinned packages)",
        tool=tool,
        env=env,
        build=[tool, "build", env, "--python", host_python, "--uv", layout.host_uv(profile), "--lock", lock_dest]
        + ["--wheelhouse", wheelhouse],
        wheels=[str(w) for w in wheels],
        wheelhouse=wheelhouse,
        job_tool=layout.tool(profile, "glm-flash-job"),
        # offline (--no-index from the wheelhouse): no network; writes the engine tree only
        sandbox=sandboxing.root_job([root]),
    )
    return env, pins


def switched(profile: Profile, env: str, spec: dict, service_env: dict, /, **check) -> EngineResult:
    """The launch `spec` accepted by the new environment's own parser (roles/engines/flag_check.py;
    `check`: what else it checks there), then `current` switched to `env`: what the service runs,
    exactly the spec that was checked."""
    directory = env_dir(profile, env)
    flag_check.apply(profile, {**spec, "python": f"{directory}/bin/python", **check})
    current_engine(
        name=f"Switch engine current -> {env} (previous kept for glm-flash-rollback)",
        tool=engine_tool(profile),
        env=env,
    )
    return EngineResult(env, directory, spec, service_env)
