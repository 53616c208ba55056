"""The CUDA header fix's operation (roles/cuda_header.py): run only when the host's check says so."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation

from pyinfra_ext import memo
from roles.facts.system import CudaHeaderCheck


@operation()
def headers_fixed(tool: str):
    """
    Fix every CUDA 12.x math_functions.h on the host that needs it (glibc >= 2.41).

    + tool: path of glm-flash-fix-cuda-header on the host

    Yields the fix command only when `--check` says a header needs it, or could not run
    yet (first deploy: the command is uploaded earlier in the same run). A header the fix
    refuses makes the command, and so the operation, fail with the command's message.
    """
    state = memo.fact(host, CudaHeaderCheck, tool=tool)
    if state["exit"] == 0:
        host.noop("CUDA 12.x headers: " + ("; ".join(state["lines"]) or "nothing to fix"))
        return
    yield StringCommand(QuoteString(tool))
