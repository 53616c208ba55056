"""Secret files (the API key, the hub token): compared on the host, never shown, never loose.

files.put would diff old and new content under `--diff` and upload straight to the
destination (0644 until its chmod). secret_file instead:
- compares what is on the host with the secret by `cmp` on the host, the secret going in on
  the command's stdin (which pyinfra never prints, at any -v): only "same" or "differs" comes
  back. A hash of the file (pyinfra's Sha256File) would be printed at -vvv, and a short key
  guessed from it offline. Then the owner and mode;
- writes it, through a root command's stdin (never pyinfra's upload, which under `_sudo` parks
  the file in the SSH user's world-readable temp file first), into a root-only staging directory
  (0700, on the same filesystem as the destination), sets owner and mode there, then renames it over the destination: the file is
  at its final mode from the first moment anyone else could reach it, and a link planted at
  the destination is replaced, not followed;
- refuses a destination directory that someone other than root may write.
The value travels wrapped in Secret, whose repr and str hide it (operation arguments can be
logged at -vvv).
"""

from __future__ import annotations

import base64
import posixpath

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation
from pyinfra.facts.files import Directory, File

from pyinfra_ext import memo
from pyinfra_ext.host_args import connector_arguments


class Secret:
    """A secret value whose repr and str never show it."""

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> bytes:
        return self._value.encode()

    def __repr__(self) -> str:
        return "Secret(<hidden>)"

    __str__ = __repr__


def _mode(value: str) -> int:
    return int(str(value), 8)


def _safe_dir(path: str, what: str) -> None:
    """Only root may write the directory (else the service user could swap what root writes)."""
    info = memo.fact(host, Directory, path=path)
    if not info:
        raise OperationError(f"{what} {path} does not exist (or is not a directory); create it before the secret")
    if info["user"] != "root" or _mode(str(info["mode"])) & 0o022:
        raise OperationError(
            f"{what} {path} is owned by {info['user']} with mode {info['mode']}: a secret is written "
            "only into a directory that no one but root may write"
        )


def _fed(host, command: StringCommand, secret: Secret):
    """`command` run on the host with the secret on its stdin (base64: one line, as pyinfra writes
    stdin), neither shown: (ok, output)."""
    stdin = base64.b64encode(secret.reveal()).decode()
    return host.run_shell_command(
        command, _stdin=stdin, print_output=False, print_input=False, **connector_arguments(host)
    )


def holds(dest: str, secret: Secret) -> bool:
    """dest's bytes are the secret's, compared on the host: the command names no secret and
    prints nothing; the secret travels on its stdin."""
    status, _ = _fed(host, StringCommand("base64", "-d", "|", "cmp", "-s", "--", "-", QuoteString(dest)), secret)
    return bool(status)


def _written(state, host, staged: str, secret: Secret) -> bool:  # pyinfra passes state and host first
    """The secret into `staged` (root's 0700 staging directory) through the command's stdin, by
    root (`_sudo` too). Not pyinfra's upload: through a sudo user that lands the file in the SSH
    user's temp file first (/tmp, the user's umask: readable by others) before root copies it."""
    ok, output = _fed(host, StringCommand("umask 077 && base64 -d >", QuoteString(staged)), secret)
    if not ok:
        logger.error(f"[{host.name}] {staged}: the secret could not be written: {output.stderr or 'no output'}")
    return ok


def secret_commands(secret: Secret, dest: str, stage_dir: str, user: str, group: str, mode: str):
    """The commands that put `secret` at dest (no checks): used by secret_file and by the
    checkpoint operation for the hub token."""
    staged = posixpath.join(stage_dir, "." + posixpath.basename(dest) + ".upload")
    yield StringCommand("install", "-d", "-m", "700", "-o", "root", "-g", "root", QuoteString(stage_dir))
    yield StringCommand("rm", "-f", QuoteString(staged))
    yield FunctionCommand(_written, (staged, secret), {})
    yield StringCommand("chown", QuoteString(f"{user}:{group}"), QuoteString(staged))
    yield StringCommand("chmod", QuoteString(mode), QuoteString(staged))
    # On disk before the rename, so a power cut leaves the old secret or the new one, never an empty file.
    yield StringCommand("sync", QuoteString(staged))
    yield StringCommand("mv", "-f", "-T", QuoteString(staged), QuoteString(dest))


@operation()
def secret_file(dest: str, secret: Secret, stage_dir: str, user: str = "root", group: str = "root", mode: str = "600"):
    """
    dest holds the secret, owned user:group with mode (0600 by default), content never shown:
    compared by hash on the host, written through stage_dir and renamed into place.

    + dest: the secret's file, an absolute path in a directory only root can write
    + secret: the value, wrapped in Secret (so it is never printed)
    + stage_dir: a root-only directory on dest's filesystem (created 0700 when missing)
    + user: the file's owner
    + group: its group
    + mode: its mode; none that lets others read or write it
    """
    if not isinstance(secret, Secret):
        raise OperationError("secret_file takes the value wrapped in Secret (so it is never printed)")
    if not posixpath.isabs(dest) or not posixpath.isabs(stage_dir):
        raise OperationError(f"secret_file needs absolute paths (got {dest}, {stage_dir})")
    if _mode(mode) & 0o077 & ~0o040:
        raise OperationError(f"secret_file: mode {mode} lets others read or write {dest}")
    _safe_dir(posixpath.dirname(dest), "the directory of")
    stage = memo.fact(host, Directory, path=stage_dir)
    if stage and (stage["user"] != "root" or _mode(str(stage["mode"])) & 0o077):
        raise OperationError(f"the staging directory {stage_dir} must be root's with mode 0700")
    info = memo.fact(host, File, path=dest)
    same = (
        info
        and (info["user"], info["group"], _mode(str(info["mode"]))) == (user, group, _mode(mode))
        and holds(dest, secret)
    )
    if same:
        host.noop(f"{dest} holds the secret (compared on the host; nothing of it shown)")
        return
    yield from secret_commands(secret, dest, stage_dir, user, group, mode)
