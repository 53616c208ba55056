"""A checkpoint from the hub on the host: the downloader installed, the checkpoint present.

Shared by the model role and the GB10 drafter (roles/engines/vllm/engine.py): each decides on the
host's state at run time and does nothing when it holds.

downloader_installed: a system user of its own (not the service user: the engine must not
be able to steer or read the download) and a venv with the hash-locked requirements
(files/hf-hub-requirements.txt), installed by uv with --require-hashes --no-index from wheels the
control machine fetched and checked for the host's own python3, as it describes itself (the
HostPython fact; the host needs no package index). A marker in the venv holds the sha256
of the requirements it was built from; it is written after the install and its check, so a
killed build is rebuilt on the next run.

checkpoint_download (its start, then its wait): `glm-flash-model-fetch check` (a fact) says
whether the commit is there and verified. When it is not, the tree is handed to the downloader's
user and the download runs as a real unit (templates/glm-flash-model-download.service.j2, the
NixOS shape): systemd restarts a failed download with a growing wait, bounded, and a reboot
resumes it (journal: `journalctl -u UNIT`; it survives a dropped SSH connection and a re-run
waits for a running one instead of starting a second). Once the checkpoint is complete the unit
file goes and the tree is sealed: root's, read-only to everyone else (the engine only reads it).
The hub token, when one is needed, is put root-only (0600 in a 0700 directory) by secret_commands
and handed to the unit with LoadCredential=: systemd reads it at each start (a restart, a boot),
so root's file stays while the unit does, and goes with it. systemd removes the credential from
/run whenever the unit stops, however it stops (SIGTERM, SIGKILL, failure).
In a fleet the seed downloads with these operations and the others receive from it
(roles/operations/fleet_transfer.py).
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import re
from collections.abc import Callable

from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, FunctionCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.api.util import get_template
from pyinfra.facts.files import File

from control import layout
from control.report import skipped
from pyinfra_ext import memo
from pyinfra_ext.refusal import refusal
from roles.facts.accounts import Account
from roles.facts.model import DownloaderMarker, ModelCheck, UnitActive, check_as_owner
from roles.facts.system import HostPython
from roles.operations import sandboxing
from roles.operations.job import followed
from roles.operations.paths import replaced_whole
from roles.operations.python import venv_commands
from roles.operations.secrets import Secret, secret_commands

COMMIT = re.compile(r"[0-9a-f]{40}")
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.-]*")


@operation()
def downloader_installed(
    venv: str, requirements: str, wheels_for: Callable[[dict | None], list[str]], user: str, uv: str
):
    """venv holds exactly `requirements` (hash-locked text), installed by `uv` (the host's one
    builder of Python environments, roles/operations/python.py) from the wheels `wheels_for(found)`
    gives for the host's own python3 as the HostPython fact found it (files on the control machine,
    checked against the lock's hashes there and again by uv here: the host needs no index); `user`
    exists to run downloads.
    The fact is read here, before the first command: while the run is planned, so that a host
    whose python3 gets no wheels (none fetched, none in the lock) is refused before anything is
    done there (wheels_for raises OperationError); and again when the operation runs, after
    base_packages: a bare Debian has no python3 while the run is planned, and the one installed
    since is the one pip runs with. A refusal then fails this host only (pyinfra_ext/refusal.py).

    + venv: the downloader's environment, an absolute path on the host
    + requirements: the hash-locked requirements text (files/hf-hub-requirements.txt) it holds
    + wheels_for: the wheels for the HostPython fact's answer, on the control machine (raises
      OperationError when there are none)
    + user: the account the downloads run as; it must exist
    + uv: the host's uv (roles/operations/python.py uv_installed)
    """
    if not posixpath.isabs(venv):
        raise OperationError(f"downloader_installed: venv must be an absolute path (got {venv})")
    account = memo.fact(host, Account, user=user)
    digest = hashlib.sha256(requirements.encode()).hexdigest()
    marker = f"{venv}/.glm-flash-requirements.sha256"
    built = memo.fact(host, DownloaderMarker, marker=marker) == digest
    wheels = []
    if not built:
        try:
            wheels = wheels_for(memo.fact(host, HostPython))
        except OperationError as e:
            if not state.is_executing or type(e) is not OperationError:
                raise  # planned: refusal.host_refusals refuses the host before anything runs
            yield refusal(str(e))
            return
    if account is None:
        yield StringCommand(
            "useradd --system --user-group --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin",
            QuoteString(user),
        )
    if built:
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
    for command in venv_commands(uv, venv, wheelhouse, req):
        yield StringCommand(command)
    yield StringCommand(q(f"{venv}/bin/python"), "-c", q("import huggingface_hub"))
    yield StringCommand("rm", "-rf", q(wheelhouse))
    # The marker last: it vouches for everything above, which is flushed to disk first (sync);
    # the marker and its directory then fsynced, so a power cut leaves no marker over empty files.
    tmp = q(marker + ".tmp")
    written = StringCommand("sync && printf '%s\\n'", q(digest), ">", tmp, "&& sync", tmp)
    yield StringCommand(written, "&& mv -f", tmp, q(marker), "&& sync", q(venv))


def _download_properties(dest: str, endpoint: str, token_path: str | None, credential: str) -> list[str]:
    """The download's and the receive's unit settings but their user: the cache, the hub, the
    sandbox (roles/operations/sandboxing.py) that lets it write `dest` only, and the token at
    `token_path` (if any) as the credential `credential`."""
    props = [
        f"CacheDirectory={layout.FETCH_CACHE.rsplit('/', 1)[1]}",
        f"Environment=HF_HOME={layout.FETCH_CACHE}",
        "Environment=HF_HUB_DISABLE_TELEMETRY=1",
        f"Environment=HF_ENDPOINT={endpoint}",
        *sandboxing.fetch_unit([dest]),
    ]
    return [*props, f"LoadCredential={credential}:{token_path}"] if token_path else props


def download_unit_command(
    unit: str,
    user: str,
    hub_python: str,
    tool: str,
    args: list[str],
    dest: str,
    endpoint: str,
    token_path: str | None,
    credential: str = "hf-token",
):
    """systemd-run --wait of a transfer that runs once, inside the deploy (the fleet's receive): its
    own user, sandboxed, the token a credential (the caller removes root's file once the unit has
    ended), journal output; its journal lines when it fails."""
    q = QuoteString
    props = [f"User={user}", f"Group={user}", *_download_properties(dest, endpoint, token_path, credential)]
    # the failure's log is this start's lines only: the unit's name is reused, its old runs are in the journal too
    parts = ["since=$(date +%s);", "systemd-run", "--quiet", "--wait", "--collect", "--service-type=exec"]
    parts.append(q(f"--unit={unit}"))
    parts += [word for p in props for word in ("-p", q(p))]
    parts += ["--", q(hub_python), q(tool), *[q(a) for a in args]]
    return StringCommand(
        *parts,
        '|| { journalctl --no-pager -o cat -n 40 --since "@$since" -u',
        q(unit),
        ">&2; echo",
        q(f"glm-flash: the {args[0] if args else tool} failed; its log: journalctl -u {unit}"),
        ">&2; exit 1; }",
    )


# systemd's restart backoff of the download unit (templates/glm-flash-model-download.service.j2):
# 10 s after the first failure, growing over 6 restarts to 10 min; the 11th start within 4 h is refused.
# About 40 min of waits before the unit gives up, as long as the hub may be away.
RESTART = dict(restart_sec="10s", steps=6, max_delay="10min", interval="4h", burst=10)


def download_unit_path(unit: str) -> str:
    return f"{layout.SYSTEMD_DIR}/{unit}.service"


def token_file(unit: str) -> str:
    """Root's file of the hub token while the download unit `unit` exists (its LoadCredential= source)."""
    return f"{layout.SECRETS_DIR}/hf-token-{unit}"


def _exec_word(arg: str) -> str:
    """`arg` as one word of ExecStart= (systemd.service(5), "Command lines"): % and $ doubled (no
    specifier, no variable), double-quoted with backslash escapes when it holds a blank or a quote."""
    arg = arg.replace("%", "%%").replace("$", "$$")
    if re.fullmatch(r"[A-Za-z0-9_./:@+=,-]+", arg):
        return arg
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def download_unit_text(
    user: str, command: list[str], dest: str, endpoint: str, token_path: str | None, what: str
) -> str:
    """The download's unit file (the NixOS shape: a real unit, systemd's restart backoff, enabled so
    a reboot resumes it): `command` as `user` in the fetch sandbox writing `dest` only, the token a
    credential systemd reads from root's `token_path` at each start. `what`: its description."""
    props = _download_properties(dest, endpoint, token_path, "hf-token")
    return get_template(str(layout.TEMPLATES / "glm-flash-model-download.service.j2")).render(
        what=what,
        user=user,
        exec_start=" ".join(_exec_word(a) for a in command),
        properties=[p.replace("%", "%%") for p in props],
        **RESTART,
    )


RUNNING = ("active", "activating", "deactivating")  # activating: waiting to be restarted too


def _unit_written(d: dict) -> list:
    """The download's unit file as `d` (the operation's arguments) says, and systemd told of it; the
    hub token's file first (systemd reads it at each start; removed once the checkpoint is complete)."""
    token_path = token_file(d["unit"]) if d["token"] is not None else None
    token = secret_commands(d["token"], token_path, layout.SECRETS_DIR, "root", "root", "600") if token_path else []
    args = ["download", "--dest", d["path"], "--repo", d["repo_id"], "--revision", d["commit"]]
    args += ["--every", str(int(d["every"]))]
    args += ["--requested", d["requested"]] if d["requested"] else []
    what = f"{d['repo_id']}@{d['commit']} into {d['path']}"
    text = download_unit_text(
        d["fetch_user"], [d["hub_python"], d["tool"], *args], d["path"], d["endpoint"], token_path, what
    )
    return [
        *token,
        *replaced_whole(io.StringIO(text), download_unit_path(d["unit"]), user="root", group="root", mode="644"),
        StringCommand("systemctl daemon-reload"),
    ]


def _start(d: dict) -> list[StringCommand]:
    """The tree handed to the downloader's user, then the unit enabled and started in the background
    by `glm-flash-job start` (its lines when it does not start)."""
    unit = f"{d['unit']}.service"
    return [
        *prepared_for(d["fetch_user"], d["path"], d["tool"], d["unit"]),
        StringCommand(QuoteString(d["job_tool"]), "start", QuoteString(unit)),
    ]


def _told(state, host, text: str) -> bool:  # pyinfra passes state and host
    logger.warning(f"[{host.name}] {text}")
    return True


@operation()
def checkpoint_download(
    repo_id: str,
    commit: str,
    path: str,
    tool: str,
    hub_python: str,
    fetch_user: str,
    job_tool: str,
    wait: bool = False,
    requested: str = "",
    token: Secret | None = None,
    endpoint: str = "https://huggingface.co",
    unit: str = "glm-flash-model-download",
    every: int = 30,
):
    """wait false (early in the run): the download of repo_id at commit into path runs, or is not
    needed: the unit `unit` is written, enabled and started in the background when the checkpoint is
    incomplete and no download runs (a re-run while one runs starts no second). The same operation
    with wait true waits for it later. The unit is a real one
    (templates/glm-flash-model-download.service.j2): systemd restarts a failed download with a
    growing wait, and a reboot resumes it.

    wait true: path holds repo_id at commit, verified, root's and read-only to others; no token
    left, and no download unit.
    The download was started with wait false (earlier in the run, or in an earlier run that was
    stopped): this waits for its unit through systemd's restarts, printing its journal lines
    (progress, failures, restarts) as they come, and fails with its log when it ended without a
    complete checkpoint. A unit that is neither running nor failed while the checkpoint is
    incomplete (stopped by hand, or started by an older deploy as a transient unit) is started again
    first: the files that finished are kept. Once the checkpoint is complete the unit and the
    token's file go, then the tree is sealed.

    + repo_id: the hub repository (zai-org/GLM-5.3-Flash); the same for the start and the wait (a
      restart is the same download)
    + commit: the full commit the checkpoint is pinned to
    + path: the checkpoint's directory on the host
    + tool: files/glm-flash-model-fetch on the host
    + hub_python: the downloader environment's python, which runs the tool in the unit (the unit
      file, written again by the wait as this run says)
    + fetch_user: the account the download runs as (it owns path until the seal: the tree is sealed
      away from it at the end)
    + job_tool: files/glm-flash-job on the host: `follow` prints the unit's lines through its restarts
    + wait: false: start the download when needed; true: wait for it, then seal
    + requested: the revision name the commit was locked from (main), for the download's record
    + token: the hub token, wrapped in Secret; handed to the unit as a credential only
    + endpoint: the hub's URL (hf_endpoint)
    + unit: the download unit's name
    + every: seconds between the download's progress lines (its journal, followed by the wait)
    """
    if not REPO_ID.fullmatch(repo_id):
        raise OperationError(f"checkpoint: {repo_id!r} is not a hub repository id (owner/name)")
    if not COMMIT.fullmatch(commit):
        raise OperationError(f"checkpoint: {commit!r} is not a commit (40 hex digits); lock the revision")
    if not posixpath.isabs(path) or path.rstrip("/") != path or not UNIT_NAME.fullmatch(unit):
        raise OperationError(f"checkpoint: bad path {path!r} or unit {unit!r}")
    d = dict(locals())
    check = memo.fact(host, ModelCheck, tool=tool, dest=path, repo=repo_id, revision=commit)
    if not wait:
        if check["exit"] == 0:
            host.noop(f"{repo_id}@{commit} is in {path}, verified")
        elif memo.fact(host, UnitActive, unit=unit) in RUNNING:
            host.noop(f"the download of {repo_id}@{commit} runs already ({unit}): the deploy waits for it later")
        else:
            yield from _unit_written(d)
            yield from _start(d)
        return
    token_path, unit_path = token_file(unit), download_unit_path(unit)
    leftovers = memo.fact(host, File, path=token_path) or memo.fact(host, File, path=unit_path)
    unit_state = memo.fact(host, UnitActive, unit=unit)
    running = unit_state in RUNNING
    if check["exit"] == 0 and check["sealed"] and not leftovers and not running:
        host.noop(f"{repo_id}@{commit} is in {path}, verified and sealed")
        return
    q = QuoteString
    if check["exit"] != 0 or running:
        yield from _unit_written(d)
        if not running and unit_state != "failed" and check["exit"] != 0:
            # stopped by hand, or an older deploy's transient unit: a failed one is followed to its end
            text = f"glm-flash: {unit} is not running and the checkpoint is incomplete: starting it again"
            yield FunctionCommand(_told, (f"{text} (finished files are kept)",), {})
            yield from _start(d)
        yield followed(unit, StringCommand(q(job_tool), "follow", q(f"{unit}.service")))
        hint = f"glm-flash: the download ended without a complete checkpoint (its reason above); its log: journalctl -u {unit}"
        yield check_as_owner(tool, path, repo_id, commit, hint=hint)
    yield StringCommand(
        "systemctl disable --now --quiet", q(f"{unit}.service"), "2>/dev/null; rm -f", q(unit_path), q(token_path)
    )
    yield StringCommand("systemctl daemon-reload")
    yield StringCommand("python3", q(tool), "seal --dest", q(path), "--owner", q(fetch_user))


@operation()
def checkpoint_staged(tool: str, path: str):
    """model_download false: the checkpoint must already be in path; the deploy stops otherwise.

    + tool: files/glm-flash-model-fetch on the host (its `check` says what is missing)
    + path: where the operator staged the checkpoint
    """
    state = memo.fact(host, ModelCheck, tool=tool, dest=path)
    if state["exit"] == 0:
        host.noop(f"the staged checkpoint in {path} is complete")
        return
    reason = state["reason"] if state["exit"] is not None else "not checked yet"
    skipped("model check", f"{reason}: the deploy stops here for this host")
    message = (
        f"glm-flash: model_download is false, so the checkpoint must be staged in {path} (config.json, "
        "model.safetensors.index.json and its shards). Copy it there, or set model_download: true."
    )
    yield check_as_owner(tool, path, hint=message)


def prepared_for(user: str, path: str, tool: str, unit: str) -> list[StringCommand]:
    """Commands that hand `path` to the downloader's `user` once no earlier transfer runs there."""
    q = QuoteString
    return [
        # A transfer from an earlier run (its SSH connection dropped): wait for it.
        StringCommand("while systemctl is-active --quiet", q(unit), "; do sleep 5; done"),
        StringCommand("mkdir -p", q(posixpath.dirname(path))),
        StringCommand("install -d -m 755 -o root -g root", q(path)),
        StringCommand("python3", q(tool), "unseal --dest", q(path), "--owner", q(user)),
    ]
