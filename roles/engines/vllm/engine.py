"""The GB10 engine: the official vLLM release the vLLM-Moet fork's patch is made for, from
hash-locked wheels, with the fork's patch and kernels at a pinned fork commit, in its own environment.

The fork is a patch plus prebuilt kernels on an official vLLM release, not a source tree; its
own Dockerfile applies the patch to the release's installed site-packages (docs/sources.md §20,
which also says why this repo installs wheels rather than building the fork's image).

Per run (platform gb10):
1. the box is recognised from its facts (roles/facts/gb10.py): aarch64, one GPU of compute
   capability 12.1 with unified memory, DGX OS (Ubuntu 24.04). Anything else stops this
   host's deploy with what was found and how to fix it;
2. the environment `vllm-moet-<commit12>-<hash>` (the hash covers the fork's repository, commit,
   patch and kernel paths, DeepGEMM's repository and commit, the vLLM release, Python and the wheel lock
   locks/vllm/<version>-aarch64.txt, made by `make vllm-lock`) is built beside the others by
   files/glm-flash-vllm-build only when it is not complete: the fork fetched at the commit (its
   patch and kernels must be where the profile says, else nothing is installed), DeepGEMM
   fetched at deepgemm_ref (HEAD verified, before anything is installed), every wheel
   of the lock by the host's uv from PyPI (--require-hashes, through the lock's own cache), DeepGEMM built from its checkout into the environment
   (--no-deps --no-build-isolation, as the fork's Dockerfile swaps it in; recorded in the
   environment's marker), the fork's patch checked with `git apply --check` and
   applied by files/glm-flash-fork-patch (refused with nothing written when it does not
   apply; recorded in the environment), the scheduler fix of the field report verified in the
   patched scheduler, the kernels copied beside it. The same commit is never built twice; a new
   commit builds a new environment while the old one keeps serving
   (the `environment built` operation of roles/operations/engine.py reads the host at run time);
3. the thinking-budget middleware (files/glm_flash_defaults.py) goes into its site-packages,
   and the launch flags are parsed by the patched engine's own parser, which must also read
   each VLLM_* setting of the unit (roles/engines/flag_check.py);
4. the drafter (licence shown in the log, accepted by the profile) is downloaded and
   verified by the model role's downloader at its pinned commit;
5. only then `current` is switched by files/glm-flash-engine (`previous` kept for
   glm-flash-rollback, older environments pruned), as on the L40S box (roles/engines/common.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pyinfra import host, logger
from pyinfra.facts.server import Arch

from control import layout
from control.profile import Problem, Profile, ProfileError, fail, refuse
from pyinfra_ext import memo
from roles import model
from roles.engines import common
from roles.engines.vllm import launch
from roles.facts.gb10 import Gb10View, MemTotalKiB, OsRelease
from roles.facts.system import Gpus
from roles.operations import paths, sandboxing
from roles.operations.engine import environment_built
from roles.operations.uploads import host_tool

LOCK_DIR = layout.LOCKS / "vllm"  # <version>-aarch64.txt: the engine's wheels, hash-locked (`make vllm-lock`)
BUILD_TOOL = "glm-flash-vllm-build"
FORK_PATCH_TOOL = "glm-flash-fork-patch"
MIDDLEWARE_FILE = layout.FILES / "glm_flash_defaults.py"
DRAFTER_LICENSE = "CC-BY-NC-ND-4.0"
DRAFTER_LICENSE_URL = "https://creativecommons.org/licenses/by-nc-nd/4.0/"


class VllmLockError(Exception):
    pass


def wheel_lock(profile: Profile) -> Path:
    """locks/vllm/<vllm_version>-aarch64.txt: the release, its torch and the fork's flashinfer."""
    path = LOCK_DIR / f"{profile.vllm_version}-aarch64.txt"
    if not path.is_file():
        raise VllmLockError(
            f"locks/vllm/{path.name} is missing: the wheels of vLLM {profile.vllm_version} are not locked"
        )
    return path


def env_id(profile: Profile) -> str:
    inputs = json.dumps(
        [
            profile.vllm_repo_url,
            profile.vllm_ref,
            "\n".join(profile.fork_patches),  # one patch: the same id as when the knob named one file
            profile.fork_kernels,
            profile.deepgemm_repo_url,
            profile.deepgemm_ref,
            profile.vllm_version,
            profile.python_version,
            hashlib.sha256(wheel_lock(profile).read_bytes()).hexdigest(),
        ]
        # the override decides what the build accepts: another environment when it is set
        + ([profile.scheduler_fix_verified_ref] if profile.scheduler_fix_verified_ref else [])
    )
    return f"vllm-moet-{profile.vllm_ref[:12]}-{hashlib.sha256(inputs.encode()).hexdigest()[:8]}"


def lock_dest(profile: Profile, env: str) -> str:
    return f"{layout.engine_root(profile)}/locks/{env}.vllm.txt"


def build_argv(profile: Profile, env: str) -> list[str]:
    return [
        layout.tool(profile, BUILD_TOOL),
        env,
        "--python",
        f"/usr/bin/python{profile.python_version}",
        "--uv",
        layout.host_uv(profile),  # the host's one builder (roles/tools.py), as the L40S engine's build names it
        "--lock",
        lock_dest(profile, env),
        "--vllm-version",
        profile.vllm_version,
        "--fork-repo",
        profile.vllm_repo_url,
        "--fork-commit",
        profile.vllm_ref,
        *(a for patch in profile.fork_patches for a in ("--fork-patch", patch)),
        "--fork-kernels",
        profile.fork_kernels,
        "--deepgemm-repo",
        profile.deepgemm_repo_url,
        "--deepgemm-commit",
        profile.deepgemm_ref,
        *(
            ["--scheduler-fix-verified-ref", profile.scheduler_fix_verified_ref]
            if profile.scheduler_fix_verified_ref
            else []
        ),
    ]


def license_notice(profile: Profile) -> str:
    return (
        f"the drafter {profile.drafter_model} is licensed {DRAFTER_LICENSE} ({DRAFTER_LICENSE_URL}): "
        "attribution, non-commercial use only, no derivatives. accept_drafter_license is true in this "
        "host's profile, so it is downloaded and served."
    )


def recognise(profile: Profile) -> Gb10View:
    """Stop this host's deploy unless its facts say GB10 box (see module doc)."""
    view = Gb10View(
        memo.fact(host, Arch) or "",
        memo.fact(host, OsRelease),
        tuple(memo.fact(host, Gpus)),
        memo.fact(host, MemTotalKiB),
    )
    problems = view.problems()
    if not view.gpus and profile.require_gpu:
        problems.append(("GPU", "nvidia-smi shows no GPU", "DGX OS ships the driver: check `nvidia-smi` on the box"))
    if problems:
        fail(
            ProfileError(
                [
                    Problem(profile.host, "platform", f"gb10, but the host's {what}: {found}", fix)
                    for what, found, fix in problems
                ]
            )
        )
    return view


def artifacts(profile: Profile) -> list[common.Upload]:
    """Nothing from the control machine: the host fetches the locked wheels and the fork itself
    (files/glm-flash-vllm-build), so the fleet has nothing of this engine to stage."""
    return []


def middleware(profile: Profile, env: str) -> None:
    """Server-side default thinking budget, loaded by vLLM's --middleware (here and the CPU engine's)."""
    paths.put(
        name=f"Thinking-budget middleware in {env}",
        src=str(MIDDLEWARE_FILE),
        dest=f"{layout.site_packages(profile, common.env_dir(profile, env))}/{MIDDLEWARE_FILE.name}",
        mode="644",
    )


def apply(profile: Profile, checkpoint_ready=lambda: None) -> common.EngineResult:
    """checkpoint_ready(): waits for the model's checkpoint (roles/model.py ready)."""
    view = recognise(profile)
    try:
        env = env_id(profile)
    except VllmLockError as e:
        refuse(
            "vllm_version",
            str(e),
            "run `make vllm-lock` on a machine that reaches PyPI and commit locks/vllm/",
        )
    logger.info(
        f"[{host.name}] GB10 box: {view.arch}, {view.os.describe()}, "
        f"{len(view.gpus)} GPU sm_{profile.gpu_compute_capability.replace('.', '')}, "
        f"{view.unified_gib} GiB unified memory"
    )
    host_tool(BUILD_TOOL, layout.bin_dir(profile))
    host_tool(FORK_PATCH_TOOL, layout.bin_dir(profile))
    common.layout_on_host(profile)
    paths.put(name=f"Wheel lock of {env}", src=str(wheel_lock(profile)), dest=lock_dest(profile, env), mode="644")
    environment_built(
        name=(
            f"vLLM {profile.vllm_version} + vLLM-Moet {profile.vllm_ref[:12]} + DeepGEMM {profile.deepgemm_ref[:12]} "
            f"built into {env} "
            "(beside the serving environment)"
        ),
        tool=common.engine_tool(profile),
        env=env,
        build=build_argv(profile, env),
        wheelhouse=f"{layout.engine_root(profile)}/wheelhouse",
        job_tool=layout.tool(profile, "glm-flash-job"),
        # fetches the fork and the lock's indexes; writes the engine tree only
        sandbox=sandboxing.root_job([layout.engine_root(profile)], network=True),
    )

    middleware(profile, env)
    logger.warning(f"[{host.name}] licence: {license_notice(profile)}")
    checkpoint_ready()  # the model (downloading since early in the run), then the drafter
    model.checkpoint(profile, profile.drafter_model, profile.drafter_revision, profile.drafter_path, model.DRAFTER_UNIT)

    # The flags against the patched engine's own parser, and the fork's settings against the
    # patched engine's files, before `current` is switched (roles/engines/flag_check.py).
    # The checkpoint's architectures against the patched registry: vLLM 0.24.0 has no GLM-5.3-Flash,
    # so only the fork's patches can teach it; a fork commit that does not stops here, not at the load.
    return common.switched(
        profile,
        env,
        launch.launch_spec(profile),
        launch.vllm_env(profile),
        env=launch.engine_env_names(profile),
        architectures_of=f"{profile.model_path}/config.json",
    )
