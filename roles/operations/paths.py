"""Files, directories and links of ours, checked from one read of every path the plan names.

pyinfra's files.* operations read two to four facts each (one SSH round trip apiece) even when
nothing is to be done. These declare their path's facts at plan time (pyinfra_ext/memo.py reads
them all in one command) and check them with pyinfra's own fact classes; only a path that
differs runs pyinfra's own operation, which decides, diffs and changes exactly as it always does.
A check here may only be stricter than pyinfra's, never looser: when in doubt, pyinfra decides.

One exception: new content. pyinfra's files.put uploads over SFTP straight onto the destination
when it connects as root (the file is truncated, then written), so a kill, a dropped connection
or a full disk midway leaves a unit, an apt source or a launch spec cut short: apt and systemd
then read half a file. `put` (and every template) writes new content whole or not at all
(`replaced_whole`): into a dot-named temporary file in the destination's own directory (apt,
systemd, modprobe and the shell ignore it there; the next run removes one a kill left behind),
owner and mode set there, synced to disk, then renamed over the destination (rename(2) is atomic
within one filesystem) and the directory synced. Owner or mode alone still goes to pyinfra.
"""

from __future__ import annotations

import posixpath
from io import StringIO
from typing import IO

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_io, get_file_sha1, get_template
from pyinfra.facts.files import Directory, File, FileContents, Link, Sha1File
from pyinfra.operations import files
from pyinfra.operations.util import files as file_utils

from pyinfra_ext import memo


def _owned(info, user: str | None, group: str | None, mode: str | None) -> bool:
    return bool(
        info
        and (user is None or info["user"] == user)
        and (group is None or info["group"] == group)
        and (mode is None or info.get("mode") == int(mode))
    )


def directory(path: str, user: str | None = None, group: str | None = None, mode: str | None = None, name: str = ""):
    memo.want(host, Directory, path=path)
    return _directory(path=path, user=user, group=group, mode=mode, name=name or f"Directory {path}")


@operation()
def _directory(path: str, user: str | None, group: str | None, mode: str | None):
    """
    A directory with its owner and mode, made or changed by pyinfra's files.directory.

    + path: the directory
    + user: its owner (None: any)
    + group: its group (None: any)
    + mode: its mode, like 755 (None: any)
    """
    if _owned(memo.fact(host, Directory, path=path), user, group, mode):
        host.noop(f"directory {path} already exists")
        return
    yield from files.directory._inner(path=path, user=user, group=group, mode=mode)


def staging_name(dest: str) -> str:
    """The temporary name new content of `dest` is written under: same directory, a leading dot and a
    suffix no reader of those directories takes (apt wants .list/.sources/.conf or none, systemd a unit
    type, modprobe .conf)."""
    return posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.glm-flash-new")


def replaced_whole(src: str | IO, dest: str, user: str | None = None, group: str | None = None, mode=None):
    """Commands that replace `dest` with `src`'s content whole or not at all (no checks: the caller
    decided that the content differs). Owner and mode are the ones asked, else those of a new file
    (the connecting user, its umask), never copied from the old file: a link planted there could
    lend the new file another user's owner or mode."""
    directory = posixpath.dirname(dest) or "/"
    tmp, q_tmp, q_dest = staging_name(dest), QuoteString(staging_name(dest)), QuoteString(dest)
    yield StringCommand("mkdir", "-p", QuoteString(directory))
    yield StringCommand("rm", "-f", q_tmp)  # a kill's leftover, or a link planted there: never written through
    yield FileUploadCommand(src, tmp)
    if user or group:
        yield file_utils.chown(tmp, user, group)
    if mode:
        yield file_utils.chmod(tmp, mode)
    # sync FILE is fsync(2) of that file (coreutils >= 8.24); of a directory, its entries.
    yield StringCommand("sync", q_tmp, "&&", "mv", "-f", "-T", q_tmp, q_dest, "&&", "sync", QuoteString(directory))


def _show_diff(src, dest: str, exists: bool) -> None:
    """What pyinfra's files.put prints under --diff."""
    if not getattr(getattr(host.state, "config", None), "DIFF", False):
        return
    old = [line + "\n" for line in (host.get_fact(FileContents, path=dest) or [])] if exists else []
    host.log(f"Will {'modify' if exists else 'create'} {dest}", logger.info)
    try:
        with get_file_io(src, "r") as f:
            new = f.readlines()
    except UnicodeDecodeError:
        logger.info("Binary file uploaded")
        return
    for line in file_utils.generate_color_diff(old, new):
        logger.info("  %s", line)
    logger.info("")


def put(src: str | IO, dest: str, user: str | None = None, group: str | None = None, mode: str | None = None, name=""):
    """src: a local file's path or a file object (its content is read once, here)."""
    memo.want(host, File, path=dest)
    memo.want(host, Sha1File, path=dest)
    return _put(src=src, dest=dest, user=user, group=group, mode=mode, name=name or f"Upload {dest}")


@operation()
def _put(src, dest: str, user: str | None, group: str | None, mode: str | None):
    """
    A file with this content, owner and mode: new content is written whole or not at all
    (replaced_whole); owner or mode alone is changed by pyinfra's files.put.

    + src: a control-machine file's path or a file object
    + dest: the file on the host
    + user: its owner (None: any)
    + group: its group (None: any)
    + mode: its mode, like 644 (None: any)
    """
    info = memo.fact(host, File, path=dest)
    same = bool(info) and memo.fact(host, Sha1File, path=dest) == get_file_sha1(src)
    if same and _owned(info, user, group, mode):
        host.noop(f"file {dest} is already uploaded")
        return
    if same:  # owner or mode only: pyinfra changes them in place, never the content
        yield from files.put._inner(src=src, dest=dest, user=user, group=group, mode=mode)
        return
    _show_diff(src, dest, bool(info))
    yield from replaced_whole(src, dest, user=user, group=group, mode=mode)


def template(src: str, dest: str, user=None, group=None, mode=None, name: str = "", **data):
    """templates/<src> rendered here, at plan time, from data alone (the profile's values)."""
    rendered = get_template(src).render(data)
    return put(StringIO(rendered), dest, user=user, group=group, mode=mode, name=name or f"Render {dest}")


def link(path: str, target: str, name: str = ""):
    memo.want(host, Link, path=path)
    return _link(path=path, target=target, name=name or f"Link {path}")


@operation()
def _link(path: str, target: str):
    """
    A symbolic link to `target`, made or changed by pyinfra's files.link.

    + path: the link
    + target: what it points at
    """
    info = memo.fact(host, Link, path=path)
    if info and info.get("link_target") == target:
        host.noop(f"link {path} already exists")
        return
    yield from files.link._inner(path=path, target=target)


def absent(path: str, name: str = ""):
    memo.want(host, File, path=path)
    return _absent(path=path, name=name or f"No {path}")


@operation()
def _absent(path: str):
    """
    No file at `path` (pyinfra's files.file, present false).

    + path: the file
    """
    if memo.fact(host, File, path=path) is None:
        host.noop(f"file {path} does not exist")
        return
    yield from files.file._inner(path=path, present=False)
