"""Before the service is (re)started: the launch flags against the installed engine's parser.

`files/glm-flash-check-flags` runs on the host with the engine environment's python and
parses the rendered flags with sglang's own parser (no GPU, nothing started). A flag the
engine does not know, or a value it refuses, fails this operation with the tool's message,
which stops the host's deploy before the launch spec is written and the unit restarted.
Nothing changes on the host when the flags are fine, so a second run reports no change.

The engine role (roles/engine_kt.py) calls apply(profile, spec) on the environment it is about
to switch to; roles/service.py then writes exactly that spec (through `current`).
"""

from __future__ import annotations

import json

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.state import StateStage

from control import layout
from control.profile import Profile
from roles.facts.system import ToolResult

TOOL = "glm-flash-check-flags"


def tool_path(profile: Profile) -> str:
    return layout.tool(profile, TOOL)


class LaunchFlagCheck(ToolResult):
    """{"exit": int|None, "lines": [...]}; exit None when the engine python or the tool is missing."""

    def command(self, python: str, tool: str, spec_json: str, record_dir: str = layout.FLAG_CHECKS):
        return StringCommand(
            "if [ -x",
            QuoteString(python),
            "] && [ -e",
            QuoteString(tool),
            "]; then",
            QuoteString(python),
            QuoteString(tool),
            "--args-json",
            QuoteString(spec_json),
            "--record-dir",
            QuoteString(record_dir),
            "2>&1; echo \"exit=$?\"; else echo missing; fi",
        )


@operation()
def flags_accepted(python: str, tool: str, spec_json: str):
    """
    Fail with the checker's message when the engine's parser refuses the flags.

    + python: the engine environment's interpreter
    + tool: glm-flash-check-flags on the host
    + spec_json: the launch spec ({module, args, api_key_flag}) as JSON
    """
    state = host.get_fact(LaunchFlagCheck, python=python, tool=tool, spec_json=spec_json)
    if state["exit"] == 0:
        host.noop("launch flags accepted by the installed engine's parser")
        return
    if state["exit"] is None and host.state.current_stage != StateStage.Execute:
        # first run: the engine or the tool is installed earlier in this run; check then
        yield StringCommand(QuoteString(python), QuoteString(tool), "--args-json", QuoteString(spec_json))
        return
    if state["exit"] is None:
        message = f"glm-flash-check-flags: {python} or {tool} is missing; the engine environment is not installed"
    else:
        message = "\n".join(line for line in state["lines"] if line.startswith("glm-flash-check-flags")) or "\n".join(
            state["lines"][-5:]
        )
    yield StringCommand("echo", QuoteString(message), ">&2; exit 1")


def apply(profile: Profile, spec: dict) -> None:
    """Check `spec` (a launch spec) with the python it names (the tool comes with roles/tools.py)."""
    check = {k: spec[k] for k in ("module", "args", "api_key_flag") if k in spec}
    flags_accepted(
        name=f"Launch flags accepted by {spec['module']} (the installed engine's own parser)",
        python=spec["python"],
        tool=tool_path(profile),
        spec_json=json.dumps(check, sort_keys=True),
    )
