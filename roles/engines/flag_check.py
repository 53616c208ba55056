"""Before the service is (re)started: the launch flags against the installed engine's parser.

`files/glm-flash-check-flags` runs on the host with the engine environment's python and
parses the rendered flags with the engine's own parser (sglang's, or vLLM 0.24.0's with the
fork's patch applied; no GPU needed, nothing started). It imports the engine in a transient
unit as the service user, nothing writable, no network (roles/operations/sandboxing.py
engine_check): root only reads its output, so a build step's `.pth` never runs as root. On the GB10 it also checks that the
patched engine reads each VLLM_* setting of the unit's environment, and that the patched
engine's model registry resolves the checkpoint's architectures (its config.json). A flag the
engine does not know, or a value it refuses, fails this operation with the tool's message,
which stops the host's deploy before the launch spec is written and the unit restarted.
Nothing changes on the host when the flags are fine, so a second run reports no change.

The engine roles (roles/engines/kt/engine.py, roles/engines/vllm/engine.py) call apply(profile, spec) on the environment it is about
to switch to; roles/service.py then writes exactly that spec (through `current`).
"""

from __future__ import annotations

import json

from control import layout
from control.profile import Profile
from roles.operations.flag_check import flags_accepted

TOOL = "glm-flash-check-flags"


def apply(profile: Profile, spec: dict) -> None:
    """Check `spec` (a launch spec) with the python it names (the tool comes with roles/tools.py)."""
    check = {
        k: spec[k] for k in ("module", "args", "extra_args", "api_key_flag", "env", "architectures_of") if k in spec
    }
    flags_accepted(
        name=f"Launch flags accepted by {spec['module']} (the installed engine's own parser)",
        python=spec["python"],
        tool=layout.tool(profile, TOOL),
        spec_json=json.dumps(check, sort_keys=True),
        user=profile.service_user,
    )
