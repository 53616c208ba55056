"""The engine's CPython installed on the host (roles/engines/interpreter.py): unpacked and checked unless the
marker of the same artifact is there, so a second run uploads nothing."""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.operations import files

from pyinfra_ext import memo
from roles.facts.engine import PythonArtifact


@operation()
def interpreter_installed(tool: str, archive: str, dest: str, sha256: str, source_prefix: str):
    """
    Unpack and check the engine's CPython under `dest` unless its marker holds `sha256`.

    + tool: glm-flash-engine on the host (unpacks, checks every extension module and the stdlib)
    + archive: the packed interpreter on the control machine
    + dest: where it lives on the host
    + sha256: the archive's digest, recorded in the marker once the check passed
    + source_prefix: sys.prefix baked into the archive's sysconfig (rewritten to dest)
    """
    if memo.fact(host, PythonArtifact, path=dest) == sha256:
        host.noop(f"interpreter {dest} installed")
        return
    upload = f"{Path(dest).parent}/.{Path(dest).name}.tar.gz"
    yield from files.put._inner(src=archive, dest=upload, mode="644")  # kept: a fleet's later worker takes it
    yield StringCommand(
        QuoteString(tool),
        "python-install",
        "--archive",
        QuoteString(upload),
        "--dest",
        QuoteString(dest),
        "--sha256",
        QuoteString(sha256),
        "--source-prefix",
        QuoteString(source_prefix),
    )
