"""The launch flags against the installed engine's own parser (roles/engines/flag_check.py): a refusal
fails the host before the launch spec is written and the unit restarted."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.state import StateStage

from pyinfra_ext import memo
from roles.facts.engine import LaunchFlagCheck, flag_check_command
from roles.operations.sandboxing import engine_check


@operation()
def flags_accepted(python: str, tool: str, spec_json: str, user: str):
    """
    Fail with the checker's message when the engine's parser refuses the flags.

    + python: the engine environment's interpreter
    + tool: glm-flash-check-flags on the host
    + spec_json: the launch spec ({module, args, api_key_flag}) as JSON
    + user: who imports the engine for the check (the service user, in a sandboxed unit; never root)
    """
    props = tuple(engine_check(user))
    state = memo.fact(host, LaunchFlagCheck, python=python, tool=tool, spec_json=spec_json, properties=props)
    if state["exit"] == 0:
        host.noop("launch flags accepted by the installed engine's parser")
        return
    if state["exit"] is None and host.state.current_stage != StateStage.Execute:
        # first run: the engine or the tool is installed earlier in this run; check then
        yield StringCommand(*flag_check_command(python, tool, spec_json, props))
        return
    if state["exit"] is None:
        message = f"glm-flash-check-flags: {python} or {tool} is missing; the engine environment is not installed"
    else:
        message = "\n".join(line for line in state["lines"] if line.startswith("glm-flash-check-flags")) or "\n".join(
            state["lines"][-5:]
        )
    yield StringCommand("echo", QuoteString(message), ">&2; exit 1")
