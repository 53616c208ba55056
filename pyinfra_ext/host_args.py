"""The connector arguments pyinfra gives every command it runs on a host (`_sudo`, `_sudo_user`,
`_su_user`, `_shell_executable`, ...), for the commands we run ourselves with
`host.run_shell_command` / `host.put_file` (the fact memo's batched read, FunctionCommands).
pyinfra's own fact read and operations take them from the current operation, a deploy's arguments,
the host's data and the config (pyinfra/api/facts.py, _handle_fact_kwargs); a direct call gets
none of them, so on a host reached as a user with `_sudo` it would run as that user."""

from __future__ import annotations

from typing import Any

from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments

# A command's own arguments, which the caller gives (or not) for each command: not the host's.
PER_COMMAND = {
    "_stdin",
    "_timeout",
    "_success_exit_codes",
    "_get_pty",
    "_retries",
    "_retry_delay",
    "_retry_until",
    "_chdir",
}


def connector_arguments(host) -> dict[str, Any]:
    """Who runs a command on this host and how (`_sudo`..., `_su_user`..., `_doas`, `_shell_executable`,
    `_env`, `_temp_dir`): everything of pyinfra's connector arguments but PER_COMMAND."""
    if getattr(host, "state", None) is None:  # a stand-in host of the unit tests: no pyinfra state
        return {}
    ctx = dict(getattr(host, "current_op_global_arguments", None) or {})
    arguments, _ = pop_global_arguments(host.state, host, ctx)
    return {k: v for k, v in arguments.items() if k in CONNECTOR_ARGUMENT_KEYS and k not in PER_COMMAND}
