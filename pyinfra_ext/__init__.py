"""Our extensions of pyinfra, each standing in for or wrapping one of pyinfra's internals.

- memo: facts read once per run while nothing changes, many in one command (pyinfra 3 has no
  fact cache: pyinfra/api/facts.py);
- op_order: the order of operations from the frames' line numbers, without inspect.stack()
  (replaces pyinfra.api.util.get_operation_order_from_stack where pyinfra.api.operation uses it);
- host_failures: a host that goes away mid-run fails alone (wraps
  pyinfra.api.operations._run_host_op_with_context);
- refusal: a refusal decided from one host's facts fails that host only (reads and clears
  pyinfra.api.state's per-host plan);
- host_args: the host's connector arguments (`_sudo`, ...) for commands we run ourselves, as
  pyinfra's fact read computes them (pyinfra.api.arguments.pop_global_arguments).

None of these names is part of pyinfra's public API: on another pyinfra they may be gone, renamed
or called differently, and a patch would then fail at the first operation or, worse, run silently
wrong. So this package refuses to load on any pyinfra but the one they were written against
(requirements.txt's pin): importing any of its modules runs this check first, before the module
reads or replaces anything of pyinfra's. Moving the pin means reading each module against the
new pyinfra's source, then moving WRITTEN_FOR (tests/unit/test_pyinfra_ext.py keeps the two equal).
"""

from __future__ import annotations

import pyinfra

WRITTEN_FOR = "3.10.0"  # the pyinfra whose internals these modules were written and tested against


def mismatch(installed: str) -> str | None:
    """What is wrong when `installed` is not the pyinfra this package was written against."""
    if installed == WRITTEN_FOR:
        return None
    return (
        f"glm-flash: pyinfra {installed} is installed, but pyinfra_ext (the fact memo, operation order, "
        f"host failures and refusals) was written against pyinfra {WRITTEN_FOR}, whose internals it "
        f"replaces. Install the pinned one: `make venv` (requirements.txt), or run "
        f"`.venv/bin/pyinfra` instead of another pyinfra."
    )


def require_written_for() -> None:
    """Refuse to go on, without a traceback, on a pyinfra this package was not written against."""
    problem = mismatch(pyinfra.__version__)
    if problem:
        raise SystemExit(problem)


require_written_for()
