"""Run an hours-long step on the host through files/glm-flash-job: a transient systemd unit.

The step survives a dropped SSH connection (it runs under systemd, logging to the journal:
`journalctl -u glm-flash-job-<name>`); a re-run while it still runs attaches to it instead of
starting a second. Its journal lines and progress are streamed to the deploy's stderr as they
come (stdout stays pyinfra's, valid JSON with --json). The caller decides from facts whether
the step is needed, as with any command; this operation only runs it.
"""

from __future__ import annotations

import re

from pyinfra import logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation

from control.layout import tool
from pyinfra_ext.host_args import connector_arguments

JOB_TOOL = "glm-flash-job"
NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PROP_RE = re.compile(r"[A-Z][A-Za-z]*=[^\n]*")
UNIT_RE = re.compile(r"[a-zA-Z0-9:_.@-]+")


RELEASE_S = 120  # a transient unit's name, waited for before systemd-run takes it again


def name_released(unit_name: str, timeout: int = RELEASE_S) -> str:
    """Shell that stops a unit of this name and waits until systemd has unloaded it, so the
    systemd-run after it can take the name (files/glm-flash-job's released() for its own jobs).

    systemd refuses a transient unit whose name it still holds ("already loaded or has a
    fragment file"), and it unloads a stopped unit only when it next looks at it: seen on the
    fleet sandbox under load, a peer server stopped in an earlier run and still loaded when the
    next run started one of that name. Asked with list-units (lists loaded units only: a stop or
    show of an unloaded transient name makes systemd log a load failure under it); while it is
    listed, a stop and reset-failed every 5 s make systemd look at it again. After `timeout`
    seconds the command fails and says so."""
    if not UNIT_RE.fullmatch(unit_name):
        raise OperationError(f"{unit_name!r} is not a unit name")
    polls = int(timeout / 0.2)
    return (
        f"n=0; while systemctl list-units --all --plain --no-legend --full {unit_name} | grep -q .; do "
        f"[ $((n % 25)) -eq 0 ] && {{ systemctl stop {unit_name}; systemctl reset-failed {unit_name}; }} 2>/dev/null; "
        f"n=$((n + 1)); [ $n -le {polls} ] || {{ echo 'glm-flash: systemd still holds {unit_name} after "
        f"{timeout} s: see systemctl status {unit_name}' >&2; exit 1; }}; sleep 0.2; done"
    )


def job_command(
    tool_path: str,
    name: str,
    command: list[str],
    user: str = "",
    env_file: str = "",
    setenv: dict[str, str] | None = None,
    watch: str = "",
    every: int = 30,
    workdir: str = "",
    properties: list[str] | None = None,
) -> StringCommand:
    """`glm-flash-job run NAME [options] -- COMMAND...`, every value quoted for the shell."""
    if not NAME_RE.fullmatch(name):
        raise OperationError(f"job name {name!r}: lower-case letters, digits and '-' only")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
        raise OperationError(f"job {name}: the command must be a non-empty list of non-empty strings, got {command!r}")
    bad = [k for k in (setenv or {}) if not ENV_NAME_RE.fullmatch(k)]
    if bad:
        raise OperationError(f"job {name}: {bad[0]!r} is not an environment variable name")
    argv = [tool_path, "run", name, "--every", str(int(every))]
    for flag, value in (("--user", user), ("--env-file", env_file), ("--watch", watch), ("--workdir", workdir)):
        if value:
            argv += [flag, value]
    for key, value in sorted((setenv or {}).items()):
        argv += ["--setenv", f"{key}={value}"]
    for prop in properties or []:
        if not PROP_RE.fullmatch(prop):
            raise OperationError(f"job {name}: {prop!r} is not a unit property (Name=value on one line)")
        argv += ["--property", prop]
    argv += ["--", *command]
    return StringCommand(*(QuoteString(a) for a in argv))


@operation(is_idempotent=False)
def job(job_name: str, command: list[str], profile, **options):
    """Run `command` (argv list, no shell) as the transient unit glm-flash-job-<name> and wait for it.

    + job_name: the unit's name part (a-z, 0-9, '-'); one job of a name runs at a time
    + command: the argv to run; a shell pipeline is ["sh", "-c", "..."] with quoted values
    + profile: the host's profile (where the host tools are)
    + options: job_command's: user (systemd-run --uid; empty: root), env_file (an EnvironmentFile
      systemd reads: secrets go here, never in command or setenv), setenv (non-secret variables),
      watch (a directory whose size and file count are reported), every (seconds between those
      progress lines), workdir, properties (the unit's sandboxing: roles/operations/sandboxing.py)
    """
    cmd = job_command(tool(profile, JOB_TOOL), job_name, command, **options)
    yield followed(job_name, cmd)


def _follow(state, host, name: str, cmd: StringCommand) -> bool:  # pyinfra passes state and host first
    # print_output streams each line to stderr as it arrives: the person sees the hours pass.
    ok, output = host.run_shell_command(cmd, print_output=True, print_input=False, **connector_arguments(host))
    if not ok:
        last = [line.line for line in output if line.buffer_name == "stderr"][-1:]
        logger.error(f"[{host.name}] job {name} did not succeed: {last[0] if last else 'no output'}")
    return ok


def step(job_tool: str, name: str, command: list[str], **options):
    """`command` as job `name` through job_tool (glm-flash-job on the host), followed; without a
    job_tool, in the SSH session (each word quoted)."""
    if job_tool:
        return followed(name, job_command(job_tool, name, command, **options))
    return StringCommand(*map(QuoteString, command))


def followed(name: str, cmd: StringCommand) -> FunctionCommand:
    """The command that runs (or attaches to) job `name` and streams its lines; for operations
    that decide from facts whether a long step is due (roles/operations/engine.py environment_built)."""
    return FunctionCommand(_follow, (name, cmd), {})
