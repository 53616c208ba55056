"""One record per run of what the roles learn for the end-of-run summary, instead of registries
at module level that carry it sideways.

What one run writes here: the steps a host skipped and why (control/report.py), why a host was
refused (pyinfra_ext/refusal.py), which seed a fleet worker received files from and the transfers' tokens (roles/fleet/),
the model download each host started (roles/model.py) and how the run shares checkpoints, the
seed's verified marker a receiving worker checks against (roles/operations/fleet_transfer.py), and
the summary's planned and gathered values (roles/summary.py).

The record is keyed per pyinfra State, as pyinfra_ext/memo.py keys the facts it keeps: two runs
in one process (tests, a program driving pyinfra's API) never see each other's, and a record
goes when its State does. Outside a real run (a plan test's stand-in state, or none) there is one
record for the process, as the module-level registries were: a test that needs a clean one
calls reset().

Failure mode: code that runs with no pyinfra context (an atexit hook) must name its State
(`of(state)`); `current()` there gives the record outside a run, which is empty.
"""

from __future__ import annotations

import secrets
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api.state import State
from pyinfra.context import state as state_proxy


@dataclass
class Record:
    # host name -> [(step, reason)], in the order they were reported (control/report.py)
    skipped: defaultdict[str, list[tuple[str, str]]] = field(default_factory=lambda: defaultdict(list))
    # host name -> [reason]: why the host was refused (pyinfra_ext/refusal.py)
    refused: defaultdict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    # worker -> the seed it receives files from in this run (roles/fleet/)
    seeded_by: dict[str, str] = field(default_factory=dict)
    # host name -> its model download started by the model role, for its wait (roles/model.py)
    model_plans: dict[str, Any] = field(default_factory=dict)
    # how this run shares checkpoints among hosts: None alone, else the fleet's (roles/fleet/checkpoint.py)
    checkpoint_sharing: Any = None
    # In a fleet behind a gateway: how the engines' restarts roll (roles/fleet/roll.py), else None.
    engine_roll: Any = None
    # transfer set name -> its random token, shared by the set's servers and receivers (roles/fleet/artifacts.py)
    peer_tokens: dict[str, Any] = field(default_factory=dict)
    # this run's own tag in its peer servers' unit names (roles/fleet/artifacts.py server_unit)
    run_tag: str = field(default_factory=lambda: secrets.token_hex(4))
    # checkpoint path -> the seed's verified marker, read on a receiving worker (roles/operations/fleet_transfer.py)
    relayed: dict[str, str] = field(default_factory=dict)
    # host name -> the profile values the summary names / what its last operation read (roles/summary.py)
    planned: dict[str, dict] = field(default_factory=dict)
    gathered: dict[str, dict] = field(default_factory=dict)


_BY_RUN: weakref.WeakKeyDictionary[State, Record] = weakref.WeakKeyDictionary()
_outside = Record()


def of(run: object) -> Record:
    """The record of `run` (a pyinfra State); outside a real run, the process's one record."""
    if isinstance(run, State):
        if run not in _BY_RUN:
            _BY_RUN[run] = Record()
        return _BY_RUN[run]
    return _outside


def current() -> Record:
    """The record of the run pyinfra's context names."""
    return of(state_proxy._get_module())


def reset() -> None:
    """A fresh record outside a run (for tests)."""
    global _outside
    _outside = Record()
