"""Fail one host, with a message a person can act on, while the other hosts go on.

An OperationError raised while pyinfra executes an operation stops every host, with a
traceback (pyinfra 3.x re-raises it from the host's greenlet). A command that returns False
fails only its host: pyinfra logs "Error" for it, drops it from the rest of the run and exits 1.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import FunctionCommand

from control.report import REFUSED


def _refuse(state, host, message: str) -> bool:
    logger.error(message)
    REFUSED[host.name].append(message)
    return False


def refusal(message: str) -> FunctionCommand:
    """Yield this from an operation to refuse the host it runs on."""
    return FunctionCommand(_refuse, (message,), {})
