"""A checkpoint from the hub on the host: the downloader installed, the checkpoint present.

Shared by the model role and the GB10 drafter (roles/engine_vllm.py): each decides on the
host's state at run time and does nothing when it holds.

downloader_installed: a system user of its own (not the service user: the engine must not
be able to steer or read the download) and a venv with the hash-locked requirements
(files/hf-hub-requirements.txt), installed with pip --require-hashes --no-index from wheels the
control machine fetched and checked (the host needs no package index). A marker in the venv holds the sha256
of the requirements it was built from; it is written after the install and its check, so a
killed build is rebuilt on the next run.

checkpoint_present: `glm-flash-model-fetch check` (a fact) says whether the commit is there
and verified. When it is not, the tree is handed to the downloader's user, the download runs
as a transient systemd unit (journal: `journalctl -u UNIT`; it survives a dropped SSH
connection and a re-run waits for a running one instead of starting a second), then the tree
is sealed: root's, read-only to everyone else (the engine only reads it). The hub token, when
one is needed, is put root-only by secret_commands and handed to the unit with LoadCredential=;
once the downloader has started, the unit (as root) deletes the file, again when the unit stops,
and systemd removes the credential when the unit ends however it ends (SIGTERM, SIGKILL, failure).
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import re

from pyinfra import host
from pyinfra.api import FileUploadCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.files import File
from pyinfra.facts.server import Users

from roles.facts.model import DownloaderMarker, ModelCheck, UnitActive
from roles.operations.secrets import Secret, secret_commands

COMMIT = re.compile(r"[0-9a-f]{40}")
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.-]*")


@operation()
def downloader_installed(venv: str, requirements: str, wheels: list[str], user: str):
    """venv holds exactly `requirements` (hash-locked text), installed from `wheels` (files on
    the control machine, checked against the lock's hashes there and again by pip here: the
    host needs no index); `user` exists to run downloads."""
    if not posixpath.isabs(venv):
        raise OperationError(f"downloader_installed: venv must be an absolute path (got {venv})")
    if user not in host.get_fact(Users):
        yield StringCommand(
            "useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin",
            QuoteString(user),
        )
    digest = hashlib.sha256(requirements.encode()).hexdigest()
    marker = f"{venv}/.glm-flash-requirements.sha256"
    if host.get_fact(DownloaderMarker, marker=marker) == digest:
        host.noop(f"downloader environment {venv} is built from these requirements")
        return
    req, wheelhouse = f"{venv}.requirements.txt", f"{venv}.wheels"
    q = QuoteString
    yield StringCommand("install", "-d", "-m", "755", "-o", "root", "-g", "root", q(posixpath.dirname(venv)))
    yield StringCommand("rm", "-rf", q(venv), q(wheelhouse))
    yield StringCommand("install", "-d", "-m", "700", "-o", "root", "-g", "root", q(wheelhouse))
    yield FileUploadCommand(io.BytesIO(requirements.encode()), req)
    yield StringCommand("chmod", "644", q(req))
    for wheel in wheels:
        yield FileUploadCommand(wheel, f"{wheelhouse}/{posixpath.basename(wheel)}")
    yield StringCommand("python3", "-m", "venv", q(venv))
    yield StringCommand(
        "env PIP_CONFIG_FILE=/dev/null",
        q(f"{venv}/bin/pip"),
        "install --quiet --disable-pip-version-check --no-deps --require-hashes --only-binary :all: --no-index",
        "--find-links",
        q(wheelhouse),
        "-r",
        q(req),
    )
    yield StringCommand(q(f"{venv}/bin/python"), "-c", q("import huggingface_hub"))
    yield StringCommand("rm", "-rf", q(wheelhouse))
    # The marker last: it vouches for everything above.
    yield StringCommand(
        "printf '%s\\n'", q(digest), ">", q(marker + ".tmp"), "&&", "mv -f", q(marker + ".tmp"), q(marker)
    )


def download_unit_command(
    unit: str,
    user: str,
    hub_python: str,
    tool: str,
    args: list[str],
    dest: str,
    endpoint: str,
    token_path: str | None,
):
    """systemd-run for the download: its own user, the token as a credential, journal output."""
    q = QuoteString
    props = [
        f"User={user}",
        f"Group={user}",
        "CacheDirectory=glm-flash-fetch",
        "Environment=HF_HOME=/var/cache/glm-flash-fetch",
        "Environment=HF_HUB_DISABLE_TELEMETRY=1",
        f"Environment=HF_ENDPOINT={endpoint}",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        f"ReadWritePaths={dest}",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "UMask=0022",
    ]
    if token_path:
        props += [
            f"LoadCredential=hf-token:{token_path}",
            # root (+), once the downloader runs: the token's only copy is then the unit's credential.
            # Not ExecStartPre: systemd 257 reads the credential again for every step, and the main
            # process would fail to start (243/CREDENTIALS) on the removed file.
            f"ExecStartPost=+/bin/rm -f {token_path}",
            f"ExecStopPost=+/bin/rm -f {token_path}",
        ]
    parts = ["systemd-run", "--quiet", "--wait", "--collect", "--service-type=exec", q(f"--unit={unit}")]
    for p in props:
        parts += ["-p", q(p)]
    parts += ["--", q(hub_python), q(tool), *[q(a) for a in args]]
    return StringCommand(
        *parts,
        "|| { journalctl --no-pager -o cat -n 40 -u",
        q(unit),
        ">&2; echo",
        q(f"glm-flash: the download failed; its log: journalctl -u {unit}"),
        ">&2; exit 1; }",
    )


@operation()
def checkpoint_present(
    repo_id: str,
    commit: str,
    path: str,
    tool: str,
    hub_python: str,
    fetch_user: str,
    secrets_dir: str,
    manifests: str = "",
    requested: str = "",
    token: Secret | None = None,
    endpoint: str = "https://huggingface.co",
    unit: str = "glm-flash-model-download",
):
    """path holds repo_id at commit, verified, root's and read-only to others; no token left.

    manifests: glm-flash-patch's manifest directory when not the tool's default (a file root
    patched after the download, such as config.json, counts as verified through it).
    """
    if not REPO_ID.fullmatch(repo_id):
        raise OperationError(f"checkpoint_present: {repo_id!r} is not a hub repository id (owner/name)")
    if not COMMIT.fullmatch(commit):
        raise OperationError(f"checkpoint_present: {commit!r} is not a commit (40 hex digits); lock the revision")
    if not posixpath.isabs(path) or path.rstrip("/") != path or not UNIT_NAME.fullmatch(unit):
        raise OperationError(f"checkpoint_present: bad path {path!r} or unit {unit!r}")
    token_path = f"{secrets_dir}/hf-token-{unit}"
    state = host.get_fact(ModelCheck, tool=tool, dest=path, repo=repo_id, revision=commit, manifests=manifests)
    token_left = host.get_fact(File, path=token_path)
    running = host.get_fact(UnitActive, unit=unit) in ("active", "activating", "deactivating")
    if state["exit"] == 0 and state["sealed"] and not token_left and not running:
        host.noop(f"{repo_id}@{commit} is in {path}, verified and sealed")
        return
    q = QuoteString
    if running:
        # A download from an earlier run (its SSH connection dropped): wait for it, then check again.
        yield StringCommand("while systemctl is-active --quiet", q(unit), "; do sleep 5; done")
    if state["exit"] != 0 or running:
        yield StringCommand("systemctl reset-failed", q(unit), "2>/dev/null || true")
        yield StringCommand("mkdir -p", q(posixpath.dirname(path)))
        yield StringCommand("install -d -m 755 -o root -g root", q(path))
        yield StringCommand("python3", q(tool), "unseal --dest", q(path), "--owner", q(fetch_user))
        if token is not None:
            yield from secret_commands(token, token_path, secrets_dir, "root", "root", "600")
        args = ["download", "--dest", path, "--repo", repo_id, "--revision", commit]
        if manifests:
            args += ["--manifests", manifests]
        if requested:
            args += ["--requested", requested]
        yield download_unit_command(
            unit, fetch_user, hub_python, tool, args, path, endpoint, token_path if token is not None else None
        )
    yield StringCommand("rm -f", q(token_path))
    yield StringCommand("python3", q(tool), "seal --dest", q(path))
