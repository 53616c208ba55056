"""Patch sets applied (roles/engines/kt/patches.py): one `glm-flash-patch apply` over every set given,
only when the host's check says something is pending."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from pyinfra_ext import memo
from roles.facts.engine import EnginePatchCheck


@operation()
def engine_patched(tool: str, sets: list[str]):
    """
    Apply every patch set of the run, only when the check says something is pending.

    + tool: glm-flash-patch on the host
    + sets: the uploaded set JSON files (all checked by the tool before any is written)

    A refused run (an upstream file changed) makes the apply command fail with the
    tool's message naming package, version, file and patch; nothing is written.
    """
    state = memo.fact(host, EnginePatchCheck, tool=tool, sets=sets)
    if state["exit"] == 0:
        host.noop(f"engine patches in place ({len(state['files'])} files)")
        return
    yield StringCommand(QuoteString(tool), "apply", *[QuoteString(s) for s in sets])
