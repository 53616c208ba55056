"""Facts read once per run while nothing changes on the host, and many read in one command.

pyinfra 3 runs a fact's command every time an operation asks for it: a converged deploy asked
about 150 times, one SSH round trip each, for a run that changes nothing. `fact()` keeps what it
read until an operation on that host has run a command (the host may then differ, so the next
read asks again).

Before the first change of a run, the first read also brings every fact the run is known to
need, in one command whose parts run side by side on the host, each by pyinfra's own class (its
command, its parser), so a value read together is the value pyinfra would have read alone.
Known: declared at plan time (`want`), or read by the last real run against that host from this
control machine (kept in the cache as `facts/<host>.json`: classes and arguments, no values). A
fact no longer needed costs one part of one command; a new one is read alone, once. After a
change the values held are stale; a stale read brings the wanted facts that come after it in the
last run's order, a window that grows while the run changes nothing (`_batch`).

The cache file names commands that run as root on the host, `--dry` included, so it is read only
when it and its directory belong to this user and nobody else may write them, and only for fact
classes of this repo (roles.facts) and the few of pyinfra's the deploy reads through `fact()`
(PYINFRA_FACTS: each quotes its arguments); an argument that names a program to run must name one
of our host tools under the host's install_root. Anything else is ignored with a warning: a cache
naming `pyinfra.facts.server.Command` runs nothing.

The one rule for callers: inside an operation, read facts before yielding commands (pyinfra's
own operations do); a command yielded by the same operation is not yet counted as a change.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import re
import stat
import weakref
from typing import Any

from pyinfra import logger
from pyinfra.api import FactBase, State, StringCommand

from control.defaults import KNOBS
from control.pypi_cache import cache_root, distrust, write_whole
from control.run import dry_run
from pyinfra_ext.host_args import connector_arguments

# A fact that printed this instead of running lacks its command (pyinfra's own marker):
# pyinfra's get_fact says so properly, so such a value is read again through it.
MISSING = "##PYINFRA_NOCMD##"
START, END = "@@glm-flash-fact", "@@glm-flash-rc"
# The only fact classes a cache file may name: this repo's, and pyinfra's that the deploy reads
# through fact() (tests/unit/test_fact_memo_trust.py keeps this list equal to those).
OUR_FACTS = "roles.facts."
# Each with the arguments it may be given: those it quotes (SystemdEnabled's `machine` and
# `user_name` go into its command unquoted, so they are not among them).
PYINFRA_FACTS = {
    "pyinfra.facts.deb.DebPackages": (),
    "pyinfra.facts.files.Directory": ("path",),
    "pyinfra.facts.files.File": ("path",),
    "pyinfra.facts.files.FileContents": ("path",),
    "pyinfra.facts.files.Link": ("path",),
    "pyinfra.facts.files.Sha1File": ("path",),
    "pyinfra.facts.files.Sha256File": ("path",),
    "pyinfra.facts.server.Arch": (),
    "pyinfra.facts.server.Groups": (),
    "pyinfra.facts.server.KernelModules": (),
    "pyinfra.facts.server.Which": ("command",),
    "pyinfra.facts.systemd.SystemdEnabled": ("services",),
}
_SEGMENTS = r"(?:/(?!\.\.?/)[A-Za-z0-9._+-]+)+"

# One memo per pyinfra run (State), so runs in one process (tests, benchmarks) never share values.
_RUNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _Run:
    def __init__(self):
        self.wanted: dict[str, dict[tuple, tuple[type[FactBase], dict]]] = {}
        self.values: dict[tuple, tuple[int, Any]] = {}
        self.read: dict[str, dict[tuple, tuple[type[FactBase], dict]]] = {}  # what this run asked, per host
        self.learned: set[str] = set()
        # After a change: how many wanted facts the next stale read brings (per host), and what the
        # last such read brought ([change count, keys, how many of them were used]).
        self.window: dict[str, int] = {}
        self.last: dict[str, list] = {}


def _run(state) -> _Run:
    if state not in _RUNS:
        _RUNS[state] = _Run()
        if isinstance(state, State) and not dry_run():  # a real run (not a test's stand-in state)
            atexit.register(_save, weakref.ref(_RUNS[state]))
    return _RUNS[state]


def _key(host, cls: type[FactBase], kwargs: dict) -> tuple:
    # As JSON: the arguments a cache file gives back (lists) name the same read as the plan's (tuples).
    return host.name, cls, json.dumps(kwargs, sort_keys=True, default=str)


def changes(state, host) -> int:
    """How many of this host's operations so far ran a command (failed ones included)."""
    done = state.ops.get(host, {}).values()
    return sum(1 for op in done if op.operation_meta.is_complete() and op.operation_meta.executed)


def want(host, cls: type[FactBase], **kwargs) -> None:
    """At plan time: this fact will be read during the run; read it with the others in one command."""
    _run(host.state).wanted.setdefault(host.name, {})[_key(host, cls, kwargs)] = (cls, kwargs)


def fact(host, cls: type[FactBase], **kwargs):
    """host.get_fact(cls, **kwargs), from this run's memo while nothing changed on the host since."""
    state = host.state
    run, now, key = _run(state), changes(state, host), _key(host, cls, kwargs)
    run.read.setdefault(host.name, {})[key] = (cls, kwargs)
    held = run.values.get(key)
    if held is not None and held[0] == now:
        last = run.last.get(host.name)
        if last and last[0] == now and key in last[1]:
            last[1].discard(key)
            last[2] += 1
        return held[1]
    _learn(run, host)
    batch = _batch(run, host, key, now)
    if len(batch) > 1:
        run.values.update((k, (now, value)) for k, value in _read_together(host, batch).items())
        held = run.values.get(key)
        if held is not None:
            return held[1]
    value = host.get_fact(cls, **kwargs)
    run.values[key] = (now, value)
    return value


FIRST_WINDOW, MAX_WINDOW = 8, 1024


def _batch(run: _Run, host, key: tuple, now: int) -> dict[tuple, tuple[type[FactBase], dict]]:
    """The wanted facts to read with `key` (itself among them) when it is not held for `now`.

    Before the run's first change on the host: every wanted fact not read yet. After a change,
    every value held is stale; the wanted facts are in the order the last run read them (the
    cache file's), so those after `key` in that order are what the next operations read. A
    window of them is read: it doubles when the previous one ran out with no change since, and
    halves (down to one: a read alone) when a change came before half of it was read. A run that
    changes the host at every operation reads alone after a few windows; the converged rest of a
    run reads in a few commands."""
    wanted = run.wanted.get(host.name, {})
    if key not in wanted:
        return {}
    if now == 0:
        return {k: v for k, v in wanted.items() if k not in run.values}
    size = run.window.get(host.name, FIRST_WINDOW)
    last = run.last.get(host.name)
    if last is not None:
        if last[0] == now:  # the last window ran out and nothing changed since: the run reads on
            size = min(MAX_WINDOW, size * 2)
        elif last[2] * 2 < last[2] + len(last[1]):  # a change came before half of it was read
            size = max(1, size // 2)  # at 1: read alone, as pyinfra does, until the changes stop
    run.window[host.name] = size
    keys = list(wanted)
    picked = {}
    for k in keys[keys.index(key) :]:
        held = run.values.get(k)
        if held is None or held[0] != now:
            picked[k] = wanted[k]
            if len(picked) == size:
                break
    run.last[host.name] = [now, set(picked) - {key}, 0]
    return picked


def _cache_file(name: str):
    return cache_root() / "facts" / f"{name.replace('/', '_')}.json"


def allowed(name: str, args: dict | None = None) -> bool:
    """A fact class (module.Class) that may be read from the cache file (with these arguments)."""
    if name.startswith(OUR_FACTS):
        return True
    return name in PYINFRA_FACTS and set(args or ()) <= set(PYINFRA_FACTS[name])


def _program_ok(host, key: str, value) -> bool:
    """An argument naming a program the fact runs as root: one of our tools in the host's
    install_root (root's), or an interpreter there; any other argument is data, quoted by the fact."""
    if key == "record_dir":  # where a check writes as root: the plan always leaves it at its default
        return False
    if key not in ("tool", "python"):
        return True
    root = host.data.get("install_root") or KNOBS["install_root"].default
    if not isinstance(value, str) or not isinstance(root, str):
        return False
    name = r"glm-flash(?:-[a-z0-9-]+)?" if key == "tool" else r"python[0-9.]*"  # glm-flash: the summary's status
    return re.fullmatch(rf"{re.escape(root)}(?:{_SEGMENTS})?/bin/{name}", value) is not None


def _cache_text(path) -> str | None:
    """The cache file's text when this user wrote it and nobody else may have, else None (and a
    warning when it exists)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        logger.warning("glm-flash: facts cache %s ignored: %s", path, e.strerror)
        return None
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        st = os.fstat(f.fileno())
        why = "it is not a regular file" if not stat.S_ISREG(st.st_mode) else distrust(st)
        if why is None:
            why = distrust(os.stat(path.parent))
            why = why and f"its directory {path.parent}: {why}"
        if why:
            logger.warning(
                "glm-flash: facts cache %s ignored: %s. Fix: remove it (the next run writes it again)", path, why
            )
            return None
        return f.read()


def _learn(run: _Run, host) -> None:
    """Want what the last real run against this host read (once per run and host)."""
    if host.name in run.learned:
        return
    run.learned.add(host.name)
    path = _cache_file(host.name)
    text = _cache_text(path)
    try:
        entries = json.loads(text) if text is not None else []
    except ValueError:
        return
    refused = set()
    learned: dict[tuple, tuple[type[FactBase], dict]] = {}
    for entry in entries if isinstance(entries, list) else []:
        try:
            name, args = entry["fact"], entry["args"]
            if not isinstance(name, str) or not isinstance(args, dict):
                continue
            if not allowed(name, args) or not all(_program_ok(host, k, v) for k, v in args.items()):
                refused.add(name)
                continue
            module, cls_name = name.rsplit(".", 1)
            cls = getattr(importlib.import_module(module), cls_name)
        except (KeyError, ValueError, TypeError, AttributeError, ImportError):
            continue
        if isinstance(cls, type) and issubclass(cls, FactBase) and f"{cls.__module__}.{cls.__qualname__}" == name:
            learned[_key(host, cls, args)] = (cls, args)
    # In the order the last run read them (what _batch's window follows), then the plan's others.
    planned = run.wanted.get(host.name, {})
    run.wanted[host.name] = {**learned, **{k: v for k, v in planned.items() if k not in learned}}
    if refused:
        logger.warning(
            "glm-flash: facts cache %s: ignored %s (not a fact this deploy reads, or a program outside "
            "its tools). Fix: remove the file if you did not write it",
            path,
            ", ".join(sorted(refused)),
        )


def _save(ref) -> None:
    run = ref()
    if run is None:
        return
    for name, read in run.read.items():
        entries = [
            {"fact": f"{cls.__module__}.{cls.__qualname__}", "args": kwargs}
            for cls, kwargs in read.values()
            if allowed(f"{cls.__module__}.{cls.__qualname__}", kwargs)
        ]
        path = _cache_file(name)
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_whole(path, json.dumps(entries, indent=0, sort_keys=True, default=str), 0o600)
        except (OSError, TypeError, ValueError) as e:
            logger.debug("memo: facts of %s not kept: %s", name, e)


def _command_of(fact_obj: FactBase, kwargs: dict):
    command = fact_obj.command(**kwargs) if callable(fact_obj.command) else fact_obj.command
    needs = fact_obj.requires_command
    needs = needs(**kwargs) if callable(needs) else needs
    if needs:
        command = StringCommand(
            "if command -v", needs, ">/dev/null 2>&1; then (", command, f"); else echo '{MISSING}'; fi"
        )
    return command


def _read_together(host, facts: dict[tuple, tuple[type[FactBase], dict]]) -> dict[tuple, Any]:
    """One command that runs each fact's own command, side by side; the values of those that ran
    cleanly, parsed by their class.

    A fact whose arguments do not fit it, that failed, lacks its command or cannot be parsed is
    left out: reading it alone through pyinfra then reports it exactly as pyinfra does.
    """
    # Each part writes its markers, output and exit status into its own file; one cat prints
    # them all (the markers carry the part's number, so their order does not matter). No process
    # is started per part beyond the fact's own command.
    parts, objs = ['d=$(mktemp -d) || exit 1;'], []
    for key, (cls, kwargs) in facts.items():
        obj = cls()
        try:
            command = _command_of(obj, kwargs)
        except (TypeError, AttributeError, ValueError):
            # arguments the class no longer takes (a cache file of an older deploy), or a base
            # class without a command of its own: read alone if the plan asks for it
            continue
        i = len(objs)
        objs.append((key, obj))
        parts += [
            f"{{ echo '{START} {i}'; (",
            command,
            f') 2>/dev/null; r=$?; echo; echo "{END} {i} $r"; }} >"$d/{i}" &',
        ]
    parts.append('wait; cat "$d"/*; rm -rf "$d"')
    status, output = host.run_shell_command(
        StringCommand(*parts), print_output=False, print_input=False, **connector_arguments(host)
    )
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
            if lines and not lines[-1]:
                # The part's own newline, after output that ended with one; output that did not
                # end with one ends with a non-empty line: either way the lines are pyinfra's.
                lines.pop()
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
