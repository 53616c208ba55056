"""The checkpoint on the host: downloaded with huggingface-hub, or staged by other means.

model_download true: a small venv (install_root/tools/hf-hub, exact pins in
files/hf-hub-requirements.txt; huggingface-hub as in the engine locks) runs
files/glm-flash-model-fetch as the service user into model_path: the revision resolves to
a commit, snapshot_download resumes whatever is already there, every file is verified
(size; sha256 for LFS files) before a marker is written. A later run only checks the
marker (no network). Pin model_revision to a commit for reproducible deploys.
model_download false: config.json, the safetensors index and every shard it names must be
in model_path, or the host's deploy stops with a message saying so.
The service runs offline (HF_HUB_OFFLINE=1 in the service environment file).

Token (only for gated/private repos): from an ansible-vault file in the repo
(hf_token_vault; password from ANSIBLE_VAULT_PASSWORD_FILE or GLM_FLASH_VAULT_PASSWORD),
else from the control machine's hf_token_env variable. It is uploaded only when a download
runs, into a 0600 file owned by the service user inside a 0700 directory, handed to the
downloader through HF_TOKEN_PATH (never in a command line) and deleted right after.
Must run after roles/users.py (the service user) and before the engine patches
(the model's config.json is edited by roles/engine_patches.py).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import yaml
from pyinfra.api import FactBase, QuoteString, StringCommand

from control.profile import Profile

REPO = Path(__file__).resolve().parent.parent
FETCH = "glm-flash-model-fetch"
REQUIREMENTS = REPO / "files" / "hf-hub-requirements.txt"


class ModelError(Exception):
    pass


def hub_venv(profile: Profile) -> str:
    return f"{profile.install_root}/tools/hf-hub"


def secret_dir(profile: Profile) -> str:
    return f"/var/lib/{profile.service_user}/secrets"


def token_path(profile: Profile) -> str:
    return f"{secret_dir(profile)}/hf-token"


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
        from ansible.errors import AnsibleError
        from ansible.parsing.vault import VaultLib, VaultSecret

        path = Path(profile.hf_token_vault)
        path = path if path.is_absolute() else REPO / path
        try:
            data = path.read_bytes()
        except OSError as e:
            raise ModelError(f"hf_token_vault {path}: cannot read it ({e.strerror})") from None
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


def download_command(profile: Profile, with_token: bool) -> str:
    """The host command: downloader as the service user; the token file goes away whatever happens."""
    import shlex

    q = shlex.quote
    env = ["HF_HUB_DISABLE_TELEMETRY=1", f"HF_HOME={q(f'/var/lib/{profile.service_user}/huggingface')}"]
    if with_token:
        env.append(f"HF_TOKEN_PATH={q(token_path(profile))}")
    run = (
        f"runuser -u {q(profile.service_user)} -- env {' '.join(env)} {q(hub_venv(profile) + '/bin/python')} "
        f"{q(profile.install_root + '/bin/' + FETCH)} download --dest {q(profile.model_path)} "
        f"--repo {q(profile.model_id)} --revision {q(profile.model_revision)}"
    )
    if not with_token:
        return run
    return f"trap 'rm -f {q(token_path(profile))}' EXIT; {run}"


class ModelCheck(FactBase):
    """`glm-flash-model-fetch check` with the host's python3: {"exit", "state", "reason"}."""

    def command(self, tool: str, dest: str, repo: str = "", revision: str = ""):
        extra = ["--repo", QuoteString(repo), "--revision", QuoteString(revision)] if repo else []
        return StringCommand(
            "if [ -e",
            QuoteString(tool),
            "]; then python3",
            QuoteString(tool),
            "check --dest",
            QuoteString(dest),
            *extra,
            "; echo \"exit=$?\"; else echo missing; fi",
        )

    @staticmethod
    def default():
        return {"exit": None, "state": "unknown", "reason": "the check tool is not installed yet"}

    @staticmethod
    def parse(lines) -> dict:
        import json

        lines = [line.strip() for line in lines if line.strip()]
        if lines == ["missing"]:
            return ModelCheck.default()
        out = {"exit": None, "state": "unknown", "reason": " ".join(lines)}
        for line in lines:
            if line.startswith("exit="):
                out["exit"] = int(line[5:])
            elif line.startswith("{"):
                try:
                    out.update(json.loads(line))
                except ValueError:
                    pass
        return out

    def process(self, output):
        return self.parse(output)


def apply(profile: Profile) -> None:
    from pyinfra import host
    from pyinfra.facts.files import File
    from pyinfra.operations import apt, files, server

    from control.layout import bin_dir
    from control.profile import Problem, ProfileError, fail
    from roles.operations.uploads import host_tool

    tool = f"{bin_dir(profile)}/{FETCH}"
    files.directory(name="Host tools directory", path=bin_dir(profile), mode="755")
    host_tool(FETCH, bin_dir(profile))

    if not profile.model_download:
        state = host.get_fact(ModelCheck, tool=tool, dest=profile.model_path)
        if state["exit"] != 0:
            reason = state["reason"] if state["exit"] is not None else "not checked yet"
            server.shell(
                name=f"Staged model in {profile.model_path}",
                commands=[
                    f"python3 {tool} check --dest '{profile.model_path}' >&2 || {{ echo "
                    f"'glm-flash: model_download is false, so the checkpoint must be staged in "
                    f"{profile.model_path} (config.json, model.safetensors.index.json and its shards). "
                    f"Copy it there, or set model_download: true.' >&2; exit 1; }}"
                ],
            )
            if state["exit"] is not None:
                from control.report import skipped

                skipped("model check", f"{reason}: the deploy stops here for this host")
        return

    try:
        token = read_token(profile)
    except ModelError as e:
        fail(ProfileError([Problem(profile.host, "hf_token_vault", str(e), "see the message")]))
        raise

    venv = hub_venv(profile)
    apt.packages(name="python3-venv (the model downloader's environment)", packages=["python3-venv"])
    files.directory(name=f"Directory {venv}", path=str(Path(venv).parent), mode="755")
    req = f"{venv}.requirements.txt"
    req_op = files.put(
        name="Pinned downloader requirements (huggingface-hub)", src=str(REQUIREMENTS), dest=req, mode="644"
    )
    marker = f"{venv}/.glm-flash-complete"
    have = host.get_fact(File, path=marker)
    if not have or req_op.will_change:
        server.shell(
            name=f"Downloader environment {venv} (huggingface-hub {profile.huggingface_hub_version})",
            commands=[
                f"rm -rf '{venv}' && python3 -m venv '{venv}' && "
                f"PIP_CONFIG_FILE=/dev/null '{venv}/bin/pip' install --quiet --disable-pip-version-check "
                f"-r '{req}' && '{venv}/bin/python' -c 'import huggingface_hub as h; "
                f"assert h.__version__ == \"{profile.huggingface_hub_version}\", h.__version__' && "
                f"touch '{marker}'"
            ],
        )

    user = profile.service_user
    files.directory(
        name=f"Model directory {profile.model_path}", path=profile.model_path, user=user, group=user, mode="755"
    )
    state = host.get_fact(
        ModelCheck, tool=tool, dest=profile.model_path, repo=profile.model_id, revision=profile.model_revision
    )
    if state["exit"] == 0:
        files.file(name="No hub token left on the host", path=token_path(profile), present=False)
        return
    if token:
        files.directory(
            name="Secrets directory (service user only)", path=secret_dir(profile), user=user, group=user, mode="700"
        )
        files.put(
            name="Hub token for this download (0600, deleted after)",
            src=io.StringIO(token),
            dest=token_path(profile),
            user=user,
            group=user,
            mode="600",
        )
    server.shell(
        name=f"Download {profile.model_id}@{profile.model_revision} into {profile.model_path} (resumable, verified)",
        commands=[download_command(profile, bool(token))],
    )
