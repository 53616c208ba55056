"""The order of operations from the deploy code's line numbers, read without loading source text.

In CLI mode pyinfra 3.10 orders operations by the line numbers of the calls that led to each one
(pyinfra.api.util.get_operation_order_from_stack). It reads them with inspect.stack(), which
also loads each frame's source line and looks its module up among every loaded module: about
4 ms per operation, a tenth of a converged deploy. operation_order() gives the same numbers from
the frames themselves (the file a frame's code came from, the line it is at), so operations are
ordered and hashed exactly as before; tests/unit/test_op_order.py compares the two on real stacks.
"""

from __future__ import annotations

import sys

import pyinfra
from pyinfra.api import util

_operation = sys.modules["pyinfra.api.operation"]  # `pyinfra.api.operation` the name is the decorator
_ORIGINAL = util.get_operation_order_from_stack


def operation_order(state) -> list[int]:
    # pyinfra's list starts at its own frame, which it then skips as pyinfra's; ours starts at
    # the caller's, so our own frame is never counted.
    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    i = 0
    if state.current_deploy_filename:
        # From the deploy file's first frame; when it is not on the stack pyinfra's loop ends on
        # its own frame, which it skips: no frame is counted.
        files = [frame.f_code.co_filename for frame in frames]
        i = files.index(state.current_deploy_filename) if state.current_deploy_filename in files else len(frames)
    line_numbers = [state.current_op_file_number] if pyinfra.is_cli else []
    for frame in frames[i:]:
        if not frame.f_code.co_filename.startswith(util.PYINFRA_INSTALL_DIR):
            line_numbers.append(frame.f_lineno)
    return line_numbers


def install() -> None:
    """Once per process (pyinfra_ext refuses to load on a pyinfra other than the pinned one)."""
    _operation.get_operation_order_from_stack = operation_order
