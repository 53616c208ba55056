"""Which hosts this pyinfra run targets (`--limit`, `--exclude`), known while the inventory loads.

pyinfra's CLI applies `--limit` and `--exclude` only after it has loaded the inventory
(pyinfra_cli/cli.py: make_inventory, then _apply_inventory_limit), but the inventory's checks run
while it loads (control/profile.py: hosts(), and check_inventory() from group_data/all.py). The
options are parsed by then: the CLI loads the inventory inside its click command, whose context
holds them. in_run() matches a host as pyinfra does: a pattern that names a group of the inventory
selects that group's hosts, any other is a shell pattern on host names (fnmatch); `--exclude` then
removes hosts the same way. Problems of the inventory as a whole (no host at all, a malformed
entry, a name given twice) and control/fleet.py's checks across a fleet (shared values, the
gateway's workers) still end the run whatever it targets.

Failure mode: outside pyinfra's CLI (pytest, testinfra, scripts) there is no click context, so
there is no limit and every host counts, the strict answer. A pyinfra that stopped naming its
parameters `limit` and `exclude` would do the same: never a host wrongly left out of the checks.
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

try:
    import click
except ImportError:  # the bench's environment loads inventories without pyinfra (and click)
    click = None


def patterns() -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(--limit patterns, --exclude patterns) of the pyinfra command line loading the inventory,
    or None when nothing limits the run."""
    ctx = click.get_current_context(silent=True) if click else None
    if ctx is None or "limit" not in ctx.params:
        return None
    limit = tuple(ctx.params.get("limit") or ())
    exclude = tuple(ctx.params.get("exclude") or ())
    return (limit, exclude) if limit or exclude else None


def _matches(name: str, pattern: str, inventory: Any) -> bool:
    group = None
    if inventory is not None:
        try:
            group = inventory.get_group(pattern)
        except Exception:  # pyinfra's NoGroupError: not a group, so a pattern on names
            group = None
    if group is not None:
        return name in {h.name for h in group}
    return fnmatch(name, pattern)


def in_run(name: str, inventory: Any, limits: tuple[tuple[str, ...], tuple[str, ...]] | None) -> bool:
    """Whether pyinfra will target host `name` of `inventory` under `limits` (from patterns())."""
    if limits is None:
        return True
    limit, exclude = limits
    if limit and not any(_matches(name, p, inventory) for p in limit):
        return False
    return not any(_matches(name, p, inventory) for p in exclude)
