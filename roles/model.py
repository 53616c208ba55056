"""The checkpoint on the host: downloaded with huggingface-hub, or staged by other means.

model_download true: model_revision resolves to a commit through the model lock (locks/model.json, or model-lock.json beside an operator's inventory)
(control/model_lock.py; a commit needs no entry), so every run and every host serves the same
commit until `make model-lock` is run on purpose. The downloader (files/glm-flash-model-fetch,
in a venv of the hash-locked files/hf-hub-requirements.txt, from wheels the control machine
fetched into its cache and checked, chosen for the host's own python3: downloader_wheels) runs
as its own system user in a transient systemd unit (roles/operations/checkpoint.py), fetches only
what is missing or differs, verifies every file (sha256 for LFS files, the git blob id for the others) and then
writes a marker; the tree is then sealed: root's, read-only to the service. A later run only
checks the marker (no network). Nothing edits the checkpoint after its download: what the
engine needs of its config.json is an edit to the engine (roles/engines/kt/patches.py).
model_download false: config.json, the safetensors index and every shard it names must be
in model_path, or the host's deploy stops with a message saying so.
The service runs offline (HF_HUB_OFFLINE=1 in the service environment file).

Token (only for gated/private repos): from an ansible-vault file in the repo
(hf_token_vault; password from ANSIBLE_VAULT_PASSWORD_FILE or GLM_FLASH_VAULT_PASSWORD),
else from the control machine's hf_token_env variable. It is put on the host only when a
download runs: root-only (roles/operations/secrets.py), handed to the download unit as a
systemd credential and deleted by the unit once the downloader runs (and again when it stops);
never in a command line or a log.
Must run after roles/users.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from pyinfra import host, logger
from pyinfra.api import OperationError

from control import layout, model_lock, run_record
from control.engine_lock import LockError, Target, cached, parse_lock
from control.engine_lock import fetch as fetch_wheels
from control.model_lock import ModelLockError, commit_for
from control.problems import Problem
from control.profile import Profile, refuse
from control.pypi_cache import FetchError, cache_root
from control.report import skipped
from control.run import dry_run
from pyinfra_ext import memo
from roles.facts.model import ModelCheck
from roles.operations.checkpoint import checkpoint_download, checkpoint_staged, downloader_installed
from roles.operations.job import JOB_TOOL
from roles.operations.secrets import Secret
from roles.operations.uploads import host_tool

__all__ = ["ModelCheck", "apply", "read_token", "ready"]

FETCH = "glm-flash-model-fetch"
# The download units (a unit file each while its checkpoint is not complete): the model's, the GB10 drafter's.
MODEL_UNIT, DRAFTER_UNIT = "glm-flash-model-download", "glm-flash-drafter-download"
REQUIREMENTS = layout.REPO / "files" / "hf-hub-requirements.txt"


class ModelError(Exception):
    pass


@dataclass(frozen=True)
class Plan:
    """A download started early in the run, for the wait where the checkpoint is needed."""

    locked_from: str  # " (main)" when the commit was locked from a moving revision, else ""
    seed: object  # in a fleet: the worker that downloads (a pyinfra Host), else None
    lacking: list  # in a fleet: names of the workers that receive it from the seed
    sources: list  # in a fleet: the workers they receive it from (every one that holds it, else the seed)
    download: dict  # checkpoint_download's arguments, for its start and its wait


class Alone:
    """How a single host shares its checkpoints: not at all, so nobody lacks one and waited() never
    asks it to copy. Another way (the fleet's, roles/fleet/checkpoint.py) has plan() and copied()
    and is registered per run with shared_by()."""

    @staticmethod
    def plan(complete) -> tuple:
        """(the host that downloads for the others, names of the hosts that receive, the hosts they receive from)."""
        return None, [], []


def shared_by(sharing) -> None:
    """This run's checkpoints are shared as `sharing` says (its plan() and copied())."""
    run_record.current().checkpoint_sharing = sharing


def sharing():
    return run_record.current().checkpoint_sharing or Alone


def fetch_user(profile: Profile) -> str:
    """The downloader's own system user: not the service user, so the engine cannot steer it."""
    return f"{profile.service_user}-fetch"


def _vault_password(environ) -> bytes:
    path = environ.get("ANSIBLE_VAULT_PASSWORD_FILE")
    if path:
        try:
            return Path(os.path.expanduser(path)).read_bytes().strip()
        except OSError as e:
            raise ModelError(
                f"cannot read the vault password file ANSIBLE_VAULT_PASSWORD_FILE={path} ({e.strerror})"
            ) from None
    if environ.get("GLM_FLASH_VAULT_PASSWORD"):
        return environ["GLM_FLASH_VAULT_PASSWORD"].encode()
    raise ModelError(
        "hf_token_vault is set but no vault password is given: set ANSIBLE_VAULT_PASSWORD_FILE "
        "(a file holding the password) or GLM_FLASH_VAULT_PASSWORD on the control machine"
    )


def read_token(profile: Profile, environ=None) -> str | None:
    """The hub token from the vault file or the control machine's environment; None without one."""
    environ = os.environ if environ is None else environ
    if profile.hf_token_vault:
        path = Path(profile.hf_token_vault)
        path = path if path.is_absolute() else layout.REPO / path
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ModelError(f"hf_token_vault {path}: cannot read it ({e.strerror})") from None
        # Imported only when a vault is used: importing ansible probes the resolver, which under
        # pyinfra's gevent prints a traceback on every deploy.
        from ansible.errors import AnsibleError
        from ansible.parsing.vault import VaultLib, VaultSecret

        vault = VaultLib([("default", VaultSecret(_vault_password(environ)))])
        if not vault.is_encrypted(data):
            raise ModelError(
                f"hf_token_vault {path} is not ansible-vault encrypted; encrypt it with "
                "`ansible-vault encrypt` (a plain token must not sit in the repo)"
            )
        try:
            plain = vault.decrypt(data).decode().strip()
        except AnsibleError:
            raise ModelError(f"hf_token_vault {path}: the vault password does not decrypt it") from None
        try:
            loaded = yaml.safe_load(plain)
        except yaml.YAMLError:
            loaded = None
        token = str(loaded["hf_token"]).strip() if isinstance(loaded, dict) and "hf_token" in loaded else plain
        if not token:
            raise ModelError(f"hf_token_vault {path} decrypts to an empty token")
        return token
    return environ.get(profile.hf_token_env) or None


def _refused(key: str, problem: str, fix: str) -> OperationError:
    """What the downloader's install raises for this host (roles/operations/checkpoint.py: while
    the run is planned it refuses the host before anything is done; while it runs, this host fails)."""
    return OperationError(str(Problem(host.name, key, problem, fix)))


def downloader_wheels(requirements: str, found: dict | None) -> list[str]:
    """The wheels of the downloader's lock for the host's own python3, `found` (the HostPython
    fact: what the interpreter says of itself, the things its pip's tags come from), in the
    control machine's cache (sha256 checked), one wheelhouse per target. DGX OS's python3.12 on
    the GB10 gets cp312 manylinux aarch64 wheels, Debian 13's python3.13 on an x86_64 box cp313
    x86_64 ones. Nothing comes from `uname -m` or the profile: a machine whose `uname` says
    otherwise (the GB10 sandbox's stand-in) still gets what its python3 installs.
    `found` None: the host has no python3 yet (a bare Debian: base_packages brings it before
    the downloader is installed); while the run is planned there is nothing to choose yet."""
    if found is None:
        if host.state.is_executing:
            raise _refused(
                "base_packages",
                "the host has no python3 to build the model downloader's environment with",
                "keep python3 in base_packages (the deploy installs it), then deploy again",
            )
        if dry_run():
            skipped(
                "choosing the model downloader's wheels",
                "dry run: the host has no python3 yet; the real run installs it, then fetches the wheels for it",
            )
        return []
    try:
        target = Target.of_interpreter(found)
    except LockError as e:
        raise _refused(
            "model_download",
            f"no wheels can be chosen for the host's python3: {e}",
            "make the distribution's own CPython 3 (glibc, 64-bit) the host's python3",
        ) from None
    pins = parse_lock(requirements, "files/hf-hub-requirements.txt")
    dest = cache_root() / "hf-hub-wheelhouse" / target.name
    if dry_run():  # a dry run fetches nothing: it shows what the real run would
        have, missing = cached(pins, dest, target)
        if missing:
            skipped(
                f"fetching {len(missing)} model downloader wheels ({target})",
                "dry run: the real run fetches them from PyPI into the cache",
            )
        return sorted(str(p) for p in have)
    try:
        have = fetch_wheels(pins, dest, target=target, wheels_only=True)
    except FetchError as e:
        raise _refused(
            "model_download",
            str(e),
            "check this machine's network access to PyPI (GLM_FLASH_PYPI_SIMPLE names a mirror), then deploy again",
        ) from None
    except LockError as e:
        raise _refused(
            "model_download",
            f"files/hf-hub-requirements.txt has no wheel for the host's python3 ({target}): {e}",
            "pin versions that ship wheels for it in locks/model-downloader.in and run `make model-downloader-lock`",
        ) from None
    return sorted(str(p) for p in have)


def hub_version(requirements: str) -> str | None:
    m = re.search(r"^huggingface[-_]hub==(\S+)", requirements, re.M | re.I)
    return m.group(1) if m else None


def apply(profile: Profile, unit: str = MODEL_UNIT) -> None:
    """Early in the run: the downloader installed and the download started in the background
    (deploy.py calls ready() where the checkpoint is needed, so the driver, toolkit and engine
    work goes on while it runs)."""
    host_tool(FETCH, layout.bin_dir(profile))
    if profile.model_download:
        run_record.current().model_plans[host.name] = started(
            profile, profile.model_id, profile.model_revision, profile.model_path, unit
        )


def ready(profile: Profile) -> None:
    """Where the checkpoint is needed (before the new engine environment is checked and switched
    to): the download started by apply() waited for, with its progress; or the staged checkpoint
    checked."""
    if not profile.model_download:
        tool = layout.tool(profile, FETCH)
        checkpoint_staged(name=f"Staged checkpoint in {profile.model_path}", tool=tool, path=profile.model_path)
        return
    waited(profile, run_record.current().model_plans.get(host.name))


def first_lock(profile: Profile, repo_id: str, revision: str, token: str | None) -> str | None:
    """A moving revision with no entry in locks/model.json: on a real run, asked of the hub once
    and recorded (then every later run and host serves that commit); a dry run asks nothing and
    writes nothing. None when there is no commit to serve (dry run, or refused)."""
    if dry_run():
        skipped(
            f"locking {repo_id}@{revision}",
            f"dry run: the real run asks the hub once for its commit and records it in {model_lock.shown(model_lock.lock_path())}",
        )
        return None
    try:
        commit = model_lock.resolve(profile.hf_endpoint, repo_id, revision, token)
        model_lock.record(repo_id, revision, commit)
    except (ModelLockError, OSError) as e:
        refuse(
            "model_revision",
            f"{repo_id}@{revision} is not in {model_lock.shown(model_lock.lock_path())} and could not be locked: {e}",
            "check hf_endpoint and the token of a gated repo, or set model_revision to a commit",
        )
    where = model_lock.shown(model_lock.lock_path())
    logger.warning(
        f"[{host.name}] {where}: {repo_id}@{revision} is now locked to {commit} (asked the hub once). "
        f"Keep {where} with your inventory (commit it where you keep the inventory) so every host and every "
        "later run serves this commit; `make model-lock` moves it on purpose."
    )
    return commit


def checkpoint(profile: Profile, repo_id: str, revision: str, path: str, unit: str) -> None:
    """`repo_id` at `revision` (resolved through locks/model.json) downloaded into `path` and
    sealed root's, waited for at once: the GB10 drafter (roles/engines/vllm/engine.py)."""
    waited(profile, started(profile, repo_id, revision, path, unit))


def started(profile: Profile, repo_id: str, revision: str, path: str, unit: str) -> Plan | None:
    """The download of `repo_id` at `revision` (resolved through locks/model.json) into `path`
    started in the background when needed; what waited() needs, None when the host was refused."""
    tool = layout.tool(profile, FETCH)
    try:
        token = read_token(profile)
    except ModelError as e:
        refuse(
            "hf_token_vault",
            str(e),
            "give the vault's password (ANSIBLE_VAULT_PASSWORD_FILE or GLM_FLASH_VAULT_PASSWORD) and check "
            "that `ansible-vault view` of the file shows the token",
        )
    try:
        commit = commit_for(repo_id, revision)
    except ModelLockError:
        commit = first_lock(profile, repo_id, revision, token)
        if commit is None:
            return None
    requirements = REQUIREMENTS.read_text()
    if hub_version(requirements) != profile.huggingface_hub_version:
        refuse(
            "huggingface_hub_version",
            f"{profile.huggingface_hub_version} differs from the downloader lock's {hub_version(requirements)}",
            "edit locks/model-downloader.in and run `make model-downloader-lock`, or use the lock's version",
        )
    locked_from = f" ({revision})" if revision != commit else ""
    venv = layout.hub_venv(profile)
    downloader_installed(
        name=f"Model downloader {venv} (huggingface-hub {profile.huggingface_hub_version}, hash-locked)",
        venv=venv,
        requirements=requirements,
        # chosen for the host's python3 where the operation reads it (after base_packages installed it)
        wheels_for=lambda found: downloader_wheels(requirements, found),
        user=fetch_user(profile),
        uv=layout.host_uv(profile),  # roles/tools.py put it there
    )
    # In a fleet one worker (the seed) downloads; the others that lack it receive it from the seed
    # (the fleet's sharing, registered for this run by roles/fleet/checkpoint.py).
    seed, lacking, sources = sharing().plan(
        lambda h: memo.fact(h, ModelCheck, tool=tool, dest=path, repo=repo_id, revision=commit)["exit"] == 0
    )
    download = dict(
        repo_id=repo_id,
        commit=commit,
        requested=revision,
        path=path,
        tool=tool,
        hub_python=f"{venv}/bin/python",
        fetch_user=fetch_user(profile),
        job_tool=layout.tool(profile, JOB_TOOL),
        token=Secret(token) if token else None,
        endpoint=profile.hf_endpoint,
        unit=unit,
        every=profile.download_progress_s,
    )
    if host.name not in lacking:
        checkpoint_download(
            name=f"Download of {repo_id}@{commit}{locked_from} into {path} started (in the background)", **download
        )
    return Plan(locked_from, seed, lacking, sources, download)


def waited(profile: Profile, plan: Plan | None) -> None:
    """The download `plan` started waited for (its progress printed), verified and sealed; in a
    fleet, the workers that lacked it receive it from the seed. None: no download was started."""
    if plan is None:
        return
    d = plan.download
    if host.name not in plan.lacking:
        checkpoint_download(
            name=f"Checkpoint {d['repo_id']}@{d['commit']}{plan.locked_from} in {d['path']}", wait=True, **d
        )
    if plan.lacking:
        sharing().copied(profile, plan)
