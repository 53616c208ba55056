"""One bad host stops only itself.

A refusal decided from one host's facts (the wrong GPUs, not a GB10, a driver too old) fails
that host when the run reaches it, and pyinfra carries on with the others; the run's exit status
is non-zero and the reason is printed for that host. Mistakes in the inventory are not this:
control/profile.py refuses them for the whole run before any host is contacted.

pyinfra fails a host, and only it, when one of its commands returns False; an exception raised
while an operation runs (OperationError included) ends the whole run instead. So the refusal is
an operation whose one command reports the reason and returns False.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import wraps

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, OperationError, operation
from pyinfra.api.state import StateHostMeta

from control import run_record
from control.problems import Problem
from control.profile import HOST_ONLY, HostRefused
from control.run import yes


def _fail_this_host(state, host, reasons: str) -> bool:  # pyinfra passes state and host by name
    for line in reasons.splitlines():
        host.log_styled(f"refused: {line}", fg="red", log_func=logger.error)
    run_record.of(state).refused[host.name].extend(reasons.splitlines())  # for the end-of-deploy summary
    return False


def refusal(reasons: str) -> FunctionCommand:
    """The command that fails this host with `reasons`; seen while pyinfra detects changes
    (a run without -y, or --dry), the reasons are said then too."""
    if not state.is_executing:
        for line in reasons.splitlines():
            logger.warning(f"[{host.name}] will be refused: {line}")
    return FunctionCommand(_fail_this_host, (reasons,), {})


def refusal_command(problems: list[Problem]) -> FunctionCommand:
    """For operations that decide from facts at run time: fail this host with these problems."""
    return refusal("\n".join(str(p) for p in problems))


def refusing(func):
    """Under @operation(): an OperationError the operation raises while it runs (a refusal from
    this host's facts: driver too old, toolkit missing) fails this host only, with its message,
    instead of ending the run for every host."""

    @wraps(func)
    def checked(*args, **kwargs):
        try:
            yield from func(*args, **kwargs)
        except OperationError as e:
            if type(e) is not OperationError:  # OperationValueError/TypeError: a bug in our call
                raise
            yield refusal(str(e))

    return checked


@operation(is_idempotent=False)
def refused(reasons: str):
    """
    This host was refused while the deploy was planned: fail it when the run reaches it.

    + reasons: the refusal's text (key, problem, fix), shown and recorded for the summary
    """
    yield FunctionCommand(_fail_this_host, (reasons,), {})


@contextmanager
def host_refusals() -> Iterator[None]:
    """Plan a host inside this: a refusal for it (profile.refuse()/fail() from a role, or an
    OperationError a role raises while planning) fails this host only, and nothing planned for
    it runs."""
    name = host.name
    HOST_ONLY.add(name)
    try:
        yield
    except HostRefused as e:
        _refuse([str(p) for p in e.problems])
    except OperationError as e:
        if type(e) is not OperationError:  # OperationValueError/TypeError: a bug in our call, not the host
            raise
        _refuse([str(e)])
    finally:
        HOST_ONLY.discard(name)


def _forget_plan() -> None:
    """Drop what was planned for this host before its refusal, so nothing of it runs there (pyinfra
    runs a host's operations in the order they were planned) and a run that shows changes first
    (no -y, --dry) shows none for it. Only while pyinfra plans; tests' stand-in state has none."""
    inventory = getattr(state, "inventory", None)
    if inventory is None:
        return
    planned = inventory.get_host(host.name)
    for op_hash in planned.op_hash_order:
        state.ops[planned].pop(op_hash, None)
    planned.op_hash_order.clear()
    state.meta[planned] = StateHostMeta()


def _refuse(reasons: list[str]) -> None:
    if not yes():  # said before pyinfra asks to go on (or stops: --dry)
        for reason in reasons:
            logger.error(f"[{host.name}] refused: {reason}")
    _forget_plan()
    refused(name="Refused: nothing of the deploy is done on this host", reasons="\n".join(reasons))
