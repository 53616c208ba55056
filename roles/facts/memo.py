"""Facts read once per run while nothing changes on the host, and many read in one command.

pyinfra 3 runs a fact's command every time an operation asks for it: a converged deploy asked
about 150 times, one SSH round trip each, for a run that changes nothing. `fact()` keeps what it
read until an operation on that host has run a command (the host may then differ, so the next
read asks again). `want()` declares at plan time a fact the run will need; the first `fact()` on
a host reads every wanted fact that is not current in the same command, each by pyinfra's own
class (its command, its parser), so a batched value is the value pyinfra would have read.

The one rule for callers: inside an operation, read facts before yielding commands (pyinfra's
own operations do); a command yielded by the same operation is not yet counted as a change.
"""

from __future__ import annotations

import weakref
from typing import Any

from pyinfra import logger
from pyinfra.api import FactBase, StringCommand

# A fact that printed this instead of running lacks its command (pyinfra's own marker):
# pyinfra's get_fact says so properly, so such a value is read again through it.
MISSING = "##PYINFRA_NOCMD##"
START, END = "@@glm-flash-fact", "@@glm-flash-rc"

# One memo per pyinfra run (State), so runs in one process (tests, benchmarks) never share values.
_RUNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Run:
    def __init__(self):
        self.wanted: dict[str, dict[tuple, tuple[type[FactBase], dict]]] = {}
        self.values: dict[tuple, tuple[int, Any]] = {}


def _run(state) -> _Run:
    if state not in _RUNS:
        _RUNS[state] = _Run()
    return _RUNS[state]


def _key(host, cls: type[FactBase], kwargs: dict) -> tuple:
    return host.name, cls, repr(sorted(kwargs.items()))


def changes(state, host) -> int:
    """How many of this host's operations so far ran a command (failed ones included)."""
    done = state.ops.get(host, {}).values()
    return sum(1 for op in done if op.operation_meta.is_complete() and op.operation_meta.executed)


def want(host, cls: type[FactBase], **kwargs) -> None:
    """At plan time: this fact will be read during the run; read it with the others in one command."""
    run = _run(host.state)
    run.wanted.setdefault(host.name, {})[_key(host, cls, kwargs)] = (cls, kwargs)


def fact(host, cls: type[FactBase], **kwargs):
    """host.get_fact(cls, **kwargs), from this run's memo while nothing changed on the host since."""
    state = host.state
    run, now, key = _run(state), changes(state, host), _key(host, cls, kwargs)
    held = run.values.get(key)
    if held is not None and held[0] == now:
        return held[1]
    stale = {k: v for k, v in run.wanted.get(host.name, {}).items() if run.values.get(k, (None,))[0] != now}
    if key in stale and len(stale) > 1:
        for k, value in _read_together(state, host, stale).items():
            run.values[k] = (now, value)
        held = run.values.get(key)
        if held is not None and held[0] == now:
            return held[1]
    value = host.get_fact(cls, **kwargs)
    run.values[key] = (now, value)
    return value


def _command_of(fact_obj: FactBase, kwargs: dict):
    command = fact_obj.command(**kwargs) if callable(fact_obj.command) else fact_obj.command
    needs = fact_obj.requires_command
    needs = needs(**kwargs) if callable(needs) else needs
    if needs:
        command = StringCommand(
            "if command -v", needs, ">/dev/null 2>&1; then (", command, f"); else echo '{MISSING}'; fi"
        )
    return command


def _read_together(state, host, facts: dict[tuple, tuple[type[FactBase], dict]]) -> dict[tuple, Any]:
    """One command that runs each fact's own command; values of those that ran cleanly, parsed by their class.

    A fact that failed, lacks its command or cannot be parsed is left out: reading it alone through
    pyinfra then reports it exactly as pyinfra does.
    """
    parts, objs = [], []
    for i, (key, (cls, kwargs)) in enumerate(facts.items()):
        obj = cls()
        objs.append((key, obj))
        # $( ) drops trailing newlines: every fact's lines end cleanly before the next marker.
        parts += [
            f"echo '{START} {i}'; out=$(",
            _command_of(obj, kwargs),
            f'); rc=$?; [ -z "$out" ] || printf \'%s\\n\' "$out"; echo "{END} {i} $rc";',
        ]
    status, output = host.run_shell_command(StringCommand(*parts), print_output=False, print_input=False)
    if not status:
        return {}
    chunks: dict[int, list[str]] = {}
    values: dict[tuple, Any] = {}
    current = None
    for line in output.stdout_lines:
        if line.startswith(f"{START} "):
            current = int(line.split()[1])
            chunks[current] = []
        elif line.startswith(f"{END} ") and current is not None:
            _, index, rc = line.split()
            lines = chunks.pop(current)
            key, obj = objs[current]
            current = None
            if rc != "0" or lines == [MISSING]:
                continue
            try:
                values[key] = obj.process(lines) if lines else obj.default()
            except Exception as e:  # noqa: BLE001 (pyinfra's own read reports it properly)
                logger.debug("memo: %s not read together: %s", obj.name, e)
        elif current is not None:
            chunks[current].append(line)
    return values
