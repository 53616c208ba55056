"""The GB10 engine: the vLLM-Moet fork at a pinned commit, in its own environment.

Per run (platform gb10):
1. the box is recognised from its facts (roles/facts/gb10.py): aarch64, one GPU of compute
   capability 12.1 with unified memory, DGX OS (Ubuntu 24.04). Anything else stops this
   host's deploy with what was found and how to fix it;
2. the environment `vllm-moet-<ref12>-<hash>` (the hash covers repository, commit, Python,
   torch index, GPU architecture and the build's hash lock locks/vllm/<ref>.json, made by
   `make vllm-lock`) is built beside the others by files/glm-flash-vllm-build, every
   requirement from that lock (--require-hashes, each name from one index), only when it is
   not complete: the same commit is never built twice, a new vllm_ref builds
   a new environment while the old one keeps serving;
   (the `environment built` operation of roles/engine.py reads the host at run time);
3. our edits go in through the patch tool (patches/vllm/0.33.0.yaml, via the engine_patches
   fact and operation): applied when the source lacks them, seen as `applied` or `upstream`
   when it has them, refused (nothing written, deploy stops) when the file drifted;
4. the thinking-budget middleware (files/glm_flash_defaults.py) goes into its site-packages;
5. the drafter (licence shown in the log, accepted by the profile) is downloaded and
   verified by the model role's downloader;
6. only then `current` is switched by files/glm-flash-engine (`previous` kept for
   glm-flash-rollback, older environments pruned), as on the L40S box (roles/engine.py).
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import yaml
from pyinfra import host, logger
from pyinfra.facts.server import Arch

from control import layout
from control.patch_sets import render, set_json
from control.profile import Problem, Profile, ProfileError, fail, refuse
from roles import engine, engine_patches, model, vllm_launch
from roles.facts import memo
from roles.facts.gb10 import Gb10View, MemTotalKiB, OsRelease
from roles.facts.system import Gpus
from roles.operations import paths
from roles.operations.engine import environment_built
from roles.operations.engine_patches import engine_patched
from roles.operations.uploads import host_tool
from roles.toolkit import toolkit_path

NAME = "vLLM"
PATCH_SET = layout.PATCHES / "vllm" / "0.33.0.yaml"
LOCK_DIR = layout.LOCKS / "vllm"  # <ref>.json: what the build installs, hash-locked (scripts/vllm_lock.py)
BUILD_TOOL = "glm-flash-vllm-build"
MIDDLEWARE_FILE = layout.FILES / "glm_flash_defaults.py"
DRAFTER_LICENSE = "CC-BY-NC-ND-4.0"
DRAFTER_LICENSE_URL = "https://creativecommons.org/licenses/by-nc-nd/4.0/"


def arch_list(profile: Profile) -> str:
    return profile.gpu_compute_capability  # "12.1" -> TORCH_CUDA_ARCH_LIST


class VllmLockError(Exception):
    pass


def build_lock(profile: Profile) -> Path:
    """locks/vllm/<vllm_ref>.json, made for this repository and commit."""
    path = LOCK_DIR / f"{profile.vllm_ref}.json"
    if not path.is_file():
        raise VllmLockError(f"locks/vllm/{path.name} is missing: nothing the build installs is locked yet")
    data = json.loads(path.read_text())
    if (data.get("repo"), data.get("ref")) != (profile.vllm_repo_url, profile.vllm_ref):
        raise VllmLockError(f"locks/vllm/{path.name} locks {data.get('repo')}, not {profile.vllm_repo_url}")
    return path


def env_id(profile: Profile) -> str:
    inputs = json.dumps(
        [
            profile.vllm_repo_url,
            profile.vllm_ref,
            profile.python_version,
            profile.vllm_torch_index_url,
            arch_list(profile),
            hashlib.sha256(build_lock(profile).read_bytes()).hexdigest(),
        ]
    )
    return f"vllm-moet-{profile.vllm_ref[:12]}-{hashlib.sha256(inputs.encode()).hexdigest()[:8]}"


def lock_dest(profile: Profile, env: str) -> str:
    return f"{layout.engine_root(profile)}/locks/{env}.vllm.json"


def build_argv(profile: Profile, env: str) -> list[str]:
    argv = [
        layout.tool(profile, BUILD_TOOL),
        env,
        "--repo",
        profile.vllm_repo_url,
        "--ref",
        profile.vllm_ref,
        "--python",
        f"/usr/bin/python{profile.python_version}",
        "--lock",
        lock_dest(profile, env),
        "--arch",
        arch_list(profile),
        "--cuda-home",
        toolkit_path(profile),
    ]
    if profile.vllm_build_jobs:
        argv += ["--jobs", str(int(profile.vllm_build_jobs))]
    return argv


def patch_set(profile: Profile, env_dir: str) -> dict:
    raw = yaml.safe_load(PATCH_SET.read_text())
    return render(raw, profile.as_dict(), layout.site_packages(profile, env_dir))


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


def launch_spec(profile: Profile, numa_nodes: int) -> dict:
    return vllm_launch.launch_spec(profile)


def apply(profile: Profile, checkpoint_ready=lambda: None) -> engine.EngineResult:
    """checkpoint_ready(): waits for the model's checkpoint (roles/model.py ready)."""
    view = recognise(profile)
    try:
        env = env_id(profile)
    except VllmLockError as e:
        refuse(
            "vllm_ref",
            str(e),
            "run `make vllm-lock INVENTORY=<this inventory>` on a machine that reaches the fork, "
            "PyPI and vllm_torch_index_url, and commit locks/vllm/",
        )
    logger.info(
        f"[{host.name}] GB10 box: {view.arch}, {view.os.describe()}, "
        f"{len(view.gpus)} GPU sm_{profile.gpu_compute_capability.replace('.', '')}, "
        f"{view.unified_gib} GiB unified memory"
    )
    env_dir = engine.env_dir(profile, env)
    host_tool(BUILD_TOOL, layout.bin_dir(profile))
    engine.layout_on_host(profile)
    paths.directory(
        name=f"Directory {layout.engine_root(profile)}/locks", path=f"{layout.engine_root(profile)}/locks", mode="755"
    )
    paths.put(name=f"Build lock of {env}", src=str(build_lock(profile)), dest=lock_dest(profile, env), mode="644")
    environment_built(
        name=f"vLLM-Moet {profile.vllm_ref[:12]} built into {env} (beside the serving environment)",
        tool=engine.engine_tool(profile),
        env=env,
        build=build_argv(profile, env),
        wheelhouse=f"{layout.engine_root(profile)}/wheelhouse",
        job_tool=layout.tool(profile, "glm-flash-job"),
    )

    # Our edits, through the patch tool (checked every run; applied only when pending).
    sets_dir = engine_patches.set_dir(env_dir)
    pset = patch_set(profile, env_dir)
    dest = f"{sets_dir}/{pset['name']}.json"
    paths.directory(name=f"Patch sets of {env}", path=sets_dir, mode="755")
    paths.put(name=f"Patch set {pset['name']}", src=io.StringIO(set_json(pset)), dest=dest, mode="644")
    engine_patched(
        name=f"vLLM patches in {env} (Mamba group block size)",
        tool=layout.tool(profile, "glm-flash-patch"),
        sets=[dest],
    )

    # Server-side default thinking budget, loaded by vLLM's --middleware.
    paths.put(
        name=f"Thinking-budget middleware in {env}",
        src=str(MIDDLEWARE_FILE),
        dest=f"{layout.site_packages(profile, env_dir)}/{MIDDLEWARE_FILE.name}",
        mode="644",
    )

    logger.warning(f"[{host.name}] licence: {license_notice(profile)}")
    checkpoint_ready()  # the model (downloading since early in the run), then the drafter
    model.checkpoint(
        profile, profile.drafter_model, profile.drafter_revision, profile.drafter_path, "glm-flash-drafter-download"
    )

    spec = vllm_launch.launch_spec(profile)
    return engine.EngineResult(NAME, env, env_dir, spec, vllm_launch.vllm_env(profile), engine.switch(profile, env))
