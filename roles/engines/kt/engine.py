"""KTransformers + SGLang-kt in their own environment, from a lock in the repo (L40S path).

Per run, for the profile's `engine_set`:
1. control machine: the lock locks/engine/<engine_set>.txt is parsed once (control/engine_lock.py),
   the file of every pin is fetched once into ${GLM_FLASH_CACHE}/wheelhouse (sha256 checked
   against the lock; a dry run fetches nothing and shows what is missing);
2. host: the lock goes up as JSON (what the host tool reads: nothing parses it twice);
3. host: `environment built`: unless envs/<engine_set>-<hash> is complete, the wheelhouse gets
   the files it lacks and the environment is built beside the others, offline:
   `uv venv`, then `uv pip install --no-index --find-links wheelhouse --require-hashes --no-deps
   --compile-bytecode` (uv pinned in locks/tools.txt, roles/operations/python.py; the lock
   already carries cuDNN 9.16.0.29 over torch's pin, docs/sources.md §3), then transformers-kt
   is reinstalled last when upstream transformers shares transformers/ (docs/sources.md §2),
   then every version is checked and a completion marker written;
4. host: `pins asserted`: the environment's cuDNN version and the owner of transformers/ are
   read on every run and put back when they drifted;
5. the patch sets (roles/engines/kt/patches.py) and tuned Triton configs (roles/engines/kt/triton_configs.py)
   go into the new environment, the engine's own parser checks the launch flags
   (roles/engines/flag_check.py), and only then `current` is switched (roles/engines/common.py).
A failed build stops the host's deploy before the switch: `current` and the running service
are untouched. Building needs no network on the host.
"""

from __future__ import annotations

import functools

from pyinfra import host

from control import layout
from control.engine_lock import PYPI_SIMPLE, LockError, env_id, fetch, load_lock, lock_path, pin_of
from control.patch_sets import PatchSetError
from control.profile import Profile, refuse
from pyinfra_ext import memo
from roles.engines import common, interpreter
from roles.engines.kt import launch, patches, triton_configs
from roles.facts.system import NumaNodes
from roles.operations import sandboxing
from roles.operations.engine import pin_asserted


@functools.lru_cache(maxsize=4)
def _lock(engine_set: str, stamp: tuple) -> tuple[bytes, list]:
    """load_lock once per lock file as it is (stamp: its path, size and change time): a fleet plans
    each worker's engine twice (its artifacts, then apply) and every worker alike (~0.1 s each)."""
    return load_lock(engine_set)


def plan(profile: Profile, python_sha256: str) -> tuple[str, list]:
    """(env name, pins) for the profile; refuses a lock that contradicts it."""
    path = lock_path(profile.engine_set)
    st = path.stat() if path.exists() else None
    data, pins = _lock(profile.engine_set, (str(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns) if st else ())
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
    return env_id(profile.engine_set, data, python_sha256), pins


def artifacts(profile: Profile) -> list[common.Upload]:
    """What apply() uploads from the control machine (common.uploads): the same list on every host
    (a fleet's transfer list, roles/fleet/artifacts.py)."""
    art = interpreter.artifact(profile)
    return common.uploads(art, fetch(plan(profile, art.sha256)[1]))


def apply(profile: Profile, checkpoint_ready=lambda: None) -> common.EngineResult:
    """checkpoint_ready(): waits for the checkpoint (roles/model.py ready), before the new environment is checked
    and switched to (the service then starts on it)."""
    env, pins = common.built_offline(
        profile,
        profile.engine_set,
        functools.partial(plan, profile),
        fetch,
        "engine_set",
        (
            "regenerate the locks with `make engine-locks`, or pick another engine_set",
            "check this machine's network access to that address (GLM_FLASH_PYPI_SIMPLE names a mirror), "
            "then run the deploy again",
        ),
        f" from {PYPI_SIMPLE} into the cache",
    )
    env_dir = common.env_dir(profile, env)
    for pin, owns in ((pin_of(pins, "nvidia-cudnn-cu12"), None), (pin_of(pins, "transformers-kt"), "transformers")):
        if pin:
            pin_asserted(
                name=f"{pin.requirement}{f' owns {owns}/' if owns else ''} in {env}",
                env=env,
                package=pin.name,
                version=pin.version,
                owns=owns,
                tool=common.engine_tool(profile),
                uv=layout.host_uv(profile),
                job_tool=layout.tool(profile, "glm-flash-job"),
                # uv runs the new environment's python: in the build's sandbox, writing that environment only
                sandbox=sandboxing.root_job([env_dir]),
            )
    try:
        patches.apply(profile, env_dir, pin_of(pins, "sglang-kt").version)
        triton = pin_of(pins, "triton")
        tuned = triton_configs.apply(
            profile, layout.site_packages(profile, env_dir), triton.version if triton else None
        )
    except PatchSetError as e:
        refuse("engine_set", str(e), "write a patch set for that version, or pick an engine_set that has one")
    except triton_configs.TritonConfigError as e:
        refuse("triton_configs_dir", str(e), "fix or remove the file, or set triton_configs_dir: '' to install none")
    checkpoint_ready()  # the checkpoint (downloading since early in the run), before anything starts on it
    # The new environment's own parser accepts the flags before it becomes `current`;
    # the service then runs exactly this spec through current/.
    spec = launch.launch_spec(profile, memo.fact(host, NumaNodes))
    return common.switched(profile, env, spec, launch.kt_env(profile, tuned))
