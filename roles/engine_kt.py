"""KTransformers + SGLang-kt in their own environment, from a lock in the repo (L40S path).

Per run, for the profile's `engine_set`:
1. control machine: the lock locks/engine/<engine_set>.txt is parsed, the file of every pin is
   fetched once into ${GLM_FLASH_CACHE}/wheelhouse (sha256 checked against the lock);
2. host: the wheelhouse under install_root/engine/wheelhouse gets the files it lacks;
3. host: if envs/<engine_set>-<hash> is not complete, it is built beside the others, offline:
   `pip install --no-index --find-links wheelhouse --require-hashes --no-deps -r lock`
   (the lock already carries cuDNN 9.16.0.29 over torch's pin, docs/sources.md §3), then
   transformers-kt is reinstalled last when upstream transformers shares transformers/
   (docs/sources.md §2), then every version is checked and a completion marker written;
4. the patch role edits the new environment (engine_patches.apply(profile, env_dir), when
   that module exists), and only then `current` is switched to it; the old one stays as
   `previous` for `glm-flash-rollback`, older ones are deleted;
5. on every run the current environment's cuDNN version and the owner of transformers/
   are read and put back when they drifted.
A failed build stops the host's deploy before the switch: `current` and the running
service are untouched. Building needs no network on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from control.engine_lock import LockError, env_id, fetch, load_lock, lock_path, pin_of
from control.profile import Problem, Profile, ProfileError, fail


@dataclass
class EngineResult:
    env: str  # <engine_set>-<hash>
    env_dir: str  # install_root/engine/envs/<env>
    python: str  # the env's interpreter (what the service runs, through current/)
    switch_op: Any  # pyinfra op that moved `current` (None when already current); restart the service _if it changed


def engine_dir(profile: Profile) -> str:
    return f"{profile.install_root}/engine"


def plan(profile: Profile, python_sha256: str) -> tuple[str, bytes, list]:
    """(env name, lock bytes, pins) for the profile; refuses a lock that contradicts it."""
    data, pins = load_lock(profile.engine_set)
    cudnn = pin_of(pins, "nvidia-cudnn-cu12")
    if cudnn is None or cudnn.version != profile.cudnn_version:
        raise LockError(
            f"{lock_path(profile.engine_set).name}: pins nvidia-cudnn-cu12 "
            f"{cudnn.version if cudnn else 'nowhere'}, the profile's cudnn_version is {profile.cudnn_version}; "
            "regenerate the locks (make engine-locks) after changing the cudnn_version default"
        )
    for name in ("ktransformers", "kt-kernel", "sglang-kt"):
        p = pin_of(pins, name)
        if p is None or p.version != profile.engine_set:
            raise LockError(
                f"{lock_path(profile.engine_set).name}: {name} is {p.version if p else 'missing'}, "
                f"expected {profile.engine_set}; regenerate it with make engine-locks"
            )
    return env_id(profile.engine_set, data, python_sha256), data, pins


def decide(state, env: str, cudnn_version: str, owner_ok: bool | None = None) -> list[str]:
    """What a run does, from the host's facts, in order: "build" (env not complete), else
    "assert-cudnn" / "assert-owner" (a complete env that drifted), then "switch" (env not
    current). A complete, current env with the right cuDNN and owner: []."""
    actions = []
    if env not in state.complete:
        actions.append("build")
    else:
        if state.version(env, "nvidia-cudnn-cu12") != cudnn_version:
            actions.append("assert-cudnn")
        if owner_ok is False:
            actions.append("assert-owner")
    if state.current != env:
        actions.append("switch")
    return actions


def apply(profile: Profile, python_artifact=None) -> EngineResult | None:
    if profile.platform != "l40s":
        return None
    from pyinfra import host
    from pyinfra.operations import files, server

    from roles import engine_patches, flag_check, launch
    from roles import python as python_role
    from roles.facts.engine import EngineEnvs, TransformersOwner, WheelhouseFiles
    from roles.facts.system import NumaNodes

    try:
        art = python_artifact or python_role.artifact(profile)
        env, lock_bytes, pins = plan(profile, art.sha256)
        wheels = fetch(pins)
    except (LockError, python_role.PythonSourceError) as e:
        fail(ProfileError([Problem(profile.host, "engine_set", str(e), "see the message")]))
        raise

    e = engine_dir(profile)
    env_dir, lock_dest, wheelhouse = f"{e}/envs/{env}", f"{e}/locks/{env}.txt", f"{e}/wheelhouse"
    tool = f"{profile.install_root}/bin/glm-flash-engine"
    for d in (e, f"{e}/envs", f"{e}/locks", wheelhouse):
        files.directory(name=f"Directory {d}", path=d, mode="755")
    files.put(name=f"Lock of {env}", src=str(lock_path(profile.engine_set)), dest=lock_dest, mode="644")
    for link in (
        f"{profile.install_root}/bin/glm-flash-rollback",
        "/usr/local/sbin/glm-flash-rollback",
        "/usr/local/sbin/glm-flash-engine",
    ):
        files.link(name=f"Link {link}", path=link, target=tool)

    state = host.get_fact(EngineEnvs, install_root=profile.install_root)
    cudnn = pin_of(pins, "nvidia-cudnn-cu12")
    owner_ok = None
    if env in state.complete and pin_of(pins, "transformers-kt"):
        owner_ok = host.get_fact(TransformersOwner, env_dir=env_dir)
    actions = decide(state, env, cudnn.version, owner_ok)
    if "build" in actions:
        have = host.get_fact(WheelhouseFiles, path=wheelhouse)
        missing = [w for w in wheels if have.get(w.name) != w.stat().st_size]
        for w in missing:
            files.put(name=f"Wheelhouse: {w.name}", src=str(w), dest=f"{wheelhouse}/{w.name}", mode="644")
        server.shell(
            name=f"Build engine environment {env} offline ({len(pins)} pinned packages)",
            commands=[
                f"{tool} build {env} --python {art.host_python(profile.install_root)} "
                f"--lock {lock_dest} --wheelhouse {wheelhouse}"
            ],
        )

    if "assert-cudnn" in actions:
        server.shell(
            name=f"Re-assert nvidia-cudnn-cu12=={cudnn.version} in {env}",
            commands=[f"{tool} assert-pin {env} nvidia-cudnn-cu12"],
        )
    if "assert-owner" in actions:
        server.shell(
            name=f"Re-assert transformers-kt as the owner of transformers/ in {env}",
            commands=[f"{tool} assert-pin {env} transformers-kt --force"],
        )

    engine_patches.apply(profile, env_dir)
    # The new environment's own parser accepts the flags before it becomes `current`.
    spec = launch.launch_spec(profile, host.get_fact(NumaNodes))
    flag_check.apply(profile, {**spec, "python": f"{env_dir}/bin/python"})

    switch_op = None
    if "switch" in actions:
        switch_op = server.shell(
            name=f"Switch engine current -> {env} (previous kept for glm-flash-rollback)",
            commands=[f"{tool} switch {env}", f"{tool} prune --keep {env}"],
        )
    return EngineResult(env, env_dir, f"{env_dir}/bin/python", switch_op)
