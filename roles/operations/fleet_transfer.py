"""A fleet's checkpoint transfer: the seed's verified marker read for the receivers, the files
served by the workers that hold them and received by those that lack them.

In a fleet the checkpoint crosses the outside link once (roles/fleet/checkpoint.py): the seed
downloads it with checkpoint_download, checkpoint_exported reads its verified marker over the
seed's SSH connection (root's, so neither the engine's user on the seed nor the local network
has a say in it), and checkpoint_received puts that marker on each worker that lacks the
checkpoint (root's file) and runs `glm-flash-model-fetch receive` as the downloader's user in a
transient unit, like the download: the engine's user steers nothing root writes, and every file
is checked against the seed's verified hashes. Then the tree is sealed as after a download.
"""

from __future__ import annotations

import io
import posixpath

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation

from control import model_lock, run_record
from pyinfra_ext.host_args import connector_arguments
from roles.facts import flags
from roles.operations.checkpoint import COMMIT, UNIT_NAME, download_unit_command, prepared_for
from roles.operations.job import name_released
from roles.operations.secrets import Secret, secret_commands


def _read_marker(state, host, path: str, command: StringCommand, hub: dict) -> bool:  # pyinfra passes state and host
    """The seed's marker, read over SSH and held against the hub's own file list at the commit,
    which the control machine asks the hub for (control/model_lock.py checked_by_hub): what the
    receivers get comes from the hub, never from a worker alone."""
    ok, output = host.run_shell_command(command, print_input=False, **connector_arguments(host))
    if not ok:
        logger.error(f"[{host.name}] {path}: no verified checkpoint to send: {output.stdout or output.stderr}")
        return False
    token = hub["token"].reveal().decode() if hub["token"] else None
    try:
        files = model_lock.hub_files(hub["endpoint"], hub["repo_id"], hub["commit"], token)
        run_record.of(state).relayed[path] = model_lock.checked_by_hub(
            output.stdout, files, hub["repo_id"], hub["commit"]
        )
    except model_lock.ModelLockError as e:
        logger.error(
            f"[{host.name}] {path}: this worker's checkpoint is not sent to the others: {e}. The control machine "
            "checks a seed's files against the hub's list (it must reach hf_endpoint); a worker whose files differ "
            "from the hub's is not trusted: remove its checkpoint directory and deploy again"
        )
        return False
    return True


def _put_marker(state, host, path: str, dest: str, seed: str) -> bool:
    marker = run_record.of(state).relayed.get(path)
    if marker is None:
        logger.error(
            f"[{host.name}] the fleet's seed {seed} sent no verified checkpoint in this run (it failed or was "
            "unreachable before it had one); deploy again"
        )
        return False
    return host.put_file(
        io.BytesIO(marker.encode()), dest, print_output=False, print_input=False, **connector_arguments(host)
    )


@operation(is_idempotent=False)
def peer_token_placed(dest: str, secret: Secret):
    """A fleet transfer's token at dest, root's and 0600, in a directory only root may enter (0700):
    a new random token for each transfer (roles/fleet/artifacts.py), uploaded over SSH, never shown.

    + dest: the token's file, an absolute path
    + secret: the token, wrapped in Secret
    """
    if not isinstance(secret, Secret) or not posixpath.isabs(dest):
        raise OperationError(f"peer_token_placed: the token wrapped in Secret, an absolute path (got {dest!r})")
    yield from secret_commands(secret, dest, posixpath.dirname(dest), "root", "root", "600")


@operation(is_idempotent=False)
def checkpoint_exported(
    seed: str,
    servers: list[str],
    path: str,
    tool: str,
    repo_id: str,
    commit: str,
    manifest: str,
    serve: list,
    hub_endpoint: str,
    hub_token: Secret | None,
):
    """On each of the fleet's `servers` (workers holding the checkpoint verified): glm-flash-peer's
    manifest written from its verified marker, `serve` (the commands that start the server). The
    seed's marker is read for the receivers and held against the hub's file list (_read_marker).
    Nothing on other hosts.

    + seed: the worker whose marker the receivers get
    + servers: the workers that serve the checkpoint
    + path: the checkpoint's directory
    + tool: files/glm-flash-model-fetch on the host (its `export` writes the manifest)
    + repo_id: what the checkpoint is, as the hub names it (zai-org/GLM-5.3-Flash)
    + commit: its full commit at the hub
    + manifest: where glm-flash-peer's manifest goes
    + serve: the commands that start the peer server (roles/fleet/artifacts.py)
    + hub_endpoint: the hub the control machine asks for the file list
    + hub_token: the hub's token in Secret, or None
    """
    if host.name not in servers:
        return
    q = QuoteString
    yield StringCommand("install -d -m 755", q(posixpath.dirname(manifest)))
    export = StringCommand(
        "python3", q(tool), "export", *flags(dest=path, repo=repo_id, revision=commit, manifest=manifest)
    )
    if host.name == seed:
        hub = {"endpoint": hub_endpoint, "token": hub_token, "repo_id": repo_id, "commit": commit}
        yield FunctionCommand(_read_marker, (path, export, hub), {})
    else:
        yield StringCommand(export, "> /dev/null")
    yield from serve


@operation(is_idempotent=False)
def checkpoint_received(
    seed: str,
    lacking: list[str],
    path: str,
    tool: str,
    repo_id: str,
    commit: str,
    sources: list[str],
    interface: str,
    token_file: str,
    peer_tool: str,
    marker: str,
    fetch_user: str,
    unit: str,
):
    """On each worker in `lacking`: the seed's marker put root's, the files received from `sources`
    (the glm-flash-peer servers of the workers holding it) by the downloader's user and checked
    against it, the tree sealed. The transfer's token (token_file, root's) reaches the receive
    unit as a credential and is removed once it runs.

    + seed: the worker whose (hub-checked) marker this run relayed
    + lacking: the workers that receive
    + path: the checkpoint's directory
    + tool: files/glm-flash-model-fetch on the host
    + repo_id: what the checkpoint is, as the hub names it (zai-org/GLM-5.3-Flash)
    + commit: its full commit at the hub
    + sources: the peer servers' URLs to fetch from
    + interface: this worker's fleet address (the servers let it in), which the fetch goes out from
    + token_file: the transfer's token, root's (peer_token_placed)
    + peer_tool: files/glm-flash-peer on the host
    + marker: where the relayed marker goes, root's
    + fetch_user: the account the receive runs as
    + unit: the receive's transient unit
    """
    if host.name not in lacking:
        return
    if not COMMIT.fullmatch(commit) or not UNIT_NAME.fullmatch(unit) or not posixpath.isabs(path):
        raise OperationError(f"checkpoint_received: bad commit {commit!r}, unit {unit!r} or path {path!r}")
    q = QuoteString
    yield StringCommand("install -d -m 755", q(posixpath.dirname(marker)))
    yield FunctionCommand(_put_marker, (path, marker, seed), {})
    yield StringCommand("chown root:root", q(marker), "&& chmod 644", q(marker))
    yield from prepared_for(fetch_user, path, tool, unit)
    # An ended transient unit systemd kept loaded (seen on systemd 257 after a receive of a few
    # small files: "already loaded or has a fragment file" at the next systemd-run).
    yield StringCommand(name_released(f"{unit}.service"))
    args = ["receive", "--dest", path, "--repo", repo_id, "--revision", commit, "--marker", marker]
    args += [word for source in sources for word in ("--source", source)]
    args += ["--peer-tool", peer_tool, "--interface", interface, "--peer-token", "peer-token"]
    # The token file is removed by the shell when the unit has ended, however it ended: a receive
    # can end before an ExecStartPost= removal, and systemd 257 then fails the unit's ExecStopPost=
    # on the missing credential file (seen on the fleet sandbox).
    receive = download_unit_command(
        unit, fetch_user, "/usr/bin/python3", tool, args, path, "", token_file, "peer-token"
    )
    yield StringCommand("trap", q(f"rm -f {token_file}"), "EXIT;", receive)
    yield StringCommand("python3", q(tool), "seal --dest", q(path), "--owner", q(fetch_user))
