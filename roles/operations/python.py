"""Python on the host: the engine's CPython, and the one way a Python environment of the host's own
python3 is built.

interpreter_installed: the engine's CPython (roles/engines/interpreter.py), unpacked and checked
unless the marker of the same artifact is there, so a second run uploads nothing.

uv_installed: the uv pinned in locks/tools.txt (the control machine's own tool), uploaded as one
root-owned executable, builds the host's Python environments: the engine's (files/glm-flash-engine,
with the packed CPython) and, through venv_commands, the model downloader's and the gateway's:
`uv venv` with the host's python3, then `uv pip install` of a hash-locked requirements file,
offline, from the wheelhouse the control machine uploaded, every file's sha256 checked. No pip or
ensurepip runs on the host and none is left in the environment; python3's venv module is not
needed. uv is chosen for the machine the host's python3 says it runs on (the HostPython fact, as the
wheels are), not `uname -m`: the GB10 sandbox's stand-in fakes that.
"""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

from pyinfra import host, state
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import File, Sha256File
from pyinfra.operations import files

from control.engine_lock import LockError, Target, host_uv
from control.pypi_cache import FetchError
from control.report import skipped
from control.run import dry_run
from pyinfra_ext import memo
from pyinfra_ext.refusal import refusal
from roles.facts import flags
from roles.facts.engine import PythonArtifact
from roles.facts.system import HostPython
from roles.operations.paths import _owned, replaced_whole


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
    options = flags(archive=upload, dest=dest, sha256=sha256, source_prefix=source_prefix)
    yield StringCommand(QuoteString(tool), "python-install", *options)


@operation()
def uv_installed(dest: str):
    """
    The uv pinned in locks/tools.txt at `dest` (root's, 755), built for the machine the host's own
    python3 runs on. The HostPython fact is read when the operation is planned and again when it
    runs: a bare host has no python3 until base_packages installs it, and a host whose python3 no
    uv is built for is refused (this host only) before any environment is touched.

    + dest: the executable's path on the host; its directory exists
    """
    found = memo.fact(host, HostPython)
    if found is None:
        if state.is_executing:
            yield refusal(
                "base_packages: the host has no python3 to build Python environments with; "
                "keep python3 in base_packages (the deploy installs it), then deploy again"
            )
        return
    try:
        uv = host_uv(Target.of_interpreter(found), fetch_missing=not dry_run())
    except (LockError, FetchError) as e:
        yield refusal(
            f"uv (locks/tools.txt) for the host's python3: {e}; check this machine's access to "
            "PyPI (GLM_FLASH_PYPI_SIMPLE names a mirror), then deploy again"
        )
        return
    if uv is None:
        skipped("uploading uv", "dry run: the real run fetches it from PyPI into the cache")
        return
    there = memo.fact(host, File, path=dest)
    if _owned(there, "root", "root", "755") and memo.fact(host, Sha256File, path=dest) == uv.sha256:
        host.noop(f"uv {dest} is the pinned one")
        return
    try:
        binary = uv.read()
    except LockError as e:
        yield refusal(f"uv (locks/tools.txt): {e}; delete the cached wheel and deploy again")
        return
    yield from replaced_whole(io.BytesIO(binary), dest, user="root", group="root", mode="755")


def venv_commands(uv: str, venv: str, wheelhouse: str, requirements: str) -> list[str]:
    """Shell commands that make `venv` (absent or an empty directory) with the host's python3 and
    install the hash-locked `requirements` into it from `wheelhouse` alone, with the uv at `uv`: no
    index, no cache, no configuration file read, wheels only, every file's sha256 checked, nothing
    beyond the file (its pins are the whole environment). `venv` may be a shell variable (`$new`:
    a directory the same command made), expanded in double quotes."""
    q = _word
    return [
        f"{q(uv)} venv --quiet --no-config --no-cache --no-python-downloads --python-preference only-system "
        f"--python python3 {q(venv)}",
        f"{q(uv)} pip install --quiet --no-config --offline --no-cache --link-mode copy "
        f"--python {q(venv + '/bin/python')} --require-hashes --no-deps --only-binary :all: --no-index "
        f"--find-links {q(wheelhouse)} -r {q(requirements)}",
    ]


def _word(path: str) -> str:
    """`path` as one shell word: quoted, or double-quoted when it starts with a shell variable."""
    if re.fullmatch(r"\$[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z0-9_./-]*)?", path):
        return f'"{path}"'
    return shlex.quote(path)
