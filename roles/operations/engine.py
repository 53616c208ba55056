"""Operations on engine environments (roles/engines/common.py, roles/engines/kt/engine.py, roles/engines/vllm/engine.py):
built beside the others, pins put back when they drifted, `current` switched. Each reads the
environments through files/glm-flash-engine (`status --json`, the EngineEnvs fact) when it runs.
"""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import FileUploadCommand, QuoteString, StringCommand, operation

from pyinfra_ext import memo
from roles.facts.engine import EngineEnvs, WheelhouseFiles
from roles.operations.job import step


@operation()
def environment_built(
    tool: str,
    env: str,
    build: list[str],
    wheels: list[str] | None = None,
    wheelhouse: str = "",
    job_tool: str = "",
    sandbox: list[str] | None = None,
):
    """
    Build the engine environment `env` beside the others unless it is complete; with `job_tool`
    the build runs as the transient unit glm-flash-job-engine-build (survives a dropped SSH
    connection, a re-run attaches to it; `journalctl -u glm-flash-job-engine-build`).

    + tool: glm-flash-engine on the host (reads the environments)
    + env: the environment's name
    + build: the build command's argv (each word quoted)
    + wheels: control-machine files the build installs from; the ones the host's wheelhouse
      lacks (or holds with another size) are uploaded first
    + wheelhouse: the host's wheelhouse directory
    + job_tool: glm-flash-job on the host; empty: the build runs in the SSH session
    + sandbox: the job unit's properties (roles/operations/sandboxing.py root_job)
    """
    if env in memo.fact(host, EngineEnvs, tool=tool).complete:
        host.noop(f"engine environment {env} is built")
        return
    if wheels:
        have = memo.fact(host, WheelhouseFiles, path=wheelhouse)
        for w in map(Path, wheels):
            if have.get(w.name) != w.stat().st_size:
                yield FileUploadCommand(str(w), f"{wheelhouse}/{w.name}")
    yield step(job_tool, "engine-build", build, watch=wheelhouse.rsplit("/", 1)[0], properties=sandbox)


@operation()
def current_engine(tool: str, env: str):
    """
    Point `current` at `env` (the old one becomes `previous`), then prune older environments.

    + tool: glm-flash-engine on the host (refuses an incomplete environment)
    + env: the environment the service runs from now on
    """
    if memo.fact(host, EngineEnvs, tool=tool).current == env:
        host.noop(f"engine current is {env}")
        return
    yield StringCommand(QuoteString(tool), "switch", QuoteString(env))
    yield StringCommand(QuoteString(tool), "prune", "--keep", QuoteString(env))


@operation()
def pin_asserted(
    tool: str,
    env: str,
    package: str,
    version: str,
    owns: str | None = None,
    job_tool: str = "",
    sandbox: list[str] | None = None,
    uv: str = "",
):
    """
    Put `package` back as locked in a complete environment when it drifted. With `job_tool` the
    reinstall (uv, which runs the environment's own python: what a build step left there runs too)
    is the transient unit glm-flash-job-engine-pin in the build's sandbox, never root's session.

    + tool: glm-flash-engine on the host
    + env: the environment
    + package: the distribution (canonical name)
    + version: the version the lock pins
    + owns: a directory `package` must have written last (shared with another distribution);
      when another one did, `package` is reinstalled over it
    + job_tool: glm-flash-job on the host
    + sandbox: the job unit's properties (roles/operations/sandboxing.py root_job, the environment writable)
    + uv: the uv that reinstalls it (roles/operations/python.py uv_installed)
    """
    state = memo.fact(host, EngineEnvs, tool=tool)
    if env not in state.complete:
        host.noop(f"{package} in {env}: installed as locked by the build")
        return
    wrong_owner = owns is not None and state.owner_ok(env, owns) is False
    if state.version(env, package) == version and not wrong_owner:
        host.noop(f"{package} {version} in {env}" + (f", owner of {owns}/" if owns else ""))
        return
    force = ["--force"] if wrong_owner else []
    force += ["--uv", uv] if uv else []  # else the tool's default, install_root/tools/uv
    yield step(job_tool, "engine-pin", [tool, "assert-pin", env, package, *force], properties=sandbox)
