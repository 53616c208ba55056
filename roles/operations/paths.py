"""Files, directories and links of ours, checked from one read of every path the plan names.

pyinfra's files.* operations read two to four facts each (one SSH round trip apiece) even when
nothing is to be done. These declare their path's facts at plan time (roles/facts/memo.py reads
them all in one command) and check them with pyinfra's own fact classes; only a path that
differs runs pyinfra's own operation, which decides, diffs and changes exactly as it always does.
A check here may only be stricter than pyinfra's, never looser: when in doubt, pyinfra decides.
"""

from __future__ import annotations

from io import StringIO
from typing import IO

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.util import get_file_sha1, get_template
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.operations import files

from roles.facts import memo


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
    if _owned(memo.fact(host, Directory, path=path), user, group, mode):
        host.noop(f"directory {path} already exists")
        return
    yield from files.directory._inner(path=path, user=user, group=group, mode=mode)


def put(src: str | IO, dest: str, user: str | None = None, group: str | None = None, mode: str | None = None, name=""):
    """src: a local file's path or a file object (its content is read once, here)."""
    memo.want(host, File, path=dest)
    memo.want(host, Sha1File, path=dest)
    return _put(src=src, dest=dest, user=user, group=group, mode=mode, name=name or f"Upload {dest}")


@operation()
def _put(src, dest: str, user: str | None, group: str | None, mode: str | None):
    if _owned(memo.fact(host, File, path=dest), user, group, mode) and memo.fact(
        host, Sha1File, path=dest
    ) == get_file_sha1(src):
        host.noop(f"file {dest} is already uploaded")
        return
    yield from files.put._inner(src=src, dest=dest, user=user, group=group, mode=mode)


def template(src: str, dest: str, user=None, group=None, mode=None, name: str = "", **data):
    """templates/<src> rendered here, at plan time, from data alone (the profile's values)."""
    rendered = get_template(src).render(data)
    return put(StringIO(rendered), dest, user=user, group=group, mode=mode, name=name or f"Render {dest}")


def link(path: str, target: str, name: str = ""):
    memo.want(host, Link, path=path)
    return _link(path=path, target=target, name=name or f"Link {path}")


@operation()
def _link(path: str, target: str):
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
    if memo.fact(host, File, path=path) is None:
        host.noop(f"file {path} does not exist")
        return
    yield from files.file._inner(path=path, present=False)
