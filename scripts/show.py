"""A host's resolved settings, each with where its value came from: `make show INVENTORY=... HOST=...`.

    python scripts/show.py inventory/local/l40s.py [HOST]

As `ansible-inventory --host` or `nixos-option` do: every knob of control/defaults.py with the
value the deploy will use and its source — `inventory` (the host's entry), `platform <name>` (the
platform's overlay, control/defaults.py PLATFORMS) or `default` — then the pyinfra keys the
inventory sets (connection, `_sudo`). The inventory's own checks run first: a mistake is
refused as the deploy refuses it, before anything is printed. Nothing is contacted.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from control.connection import is_pyinfra_key  # noqa: E402
from control.defaults import KNOBS, PLATFORMS  # noqa: E402
from control.profile import ProfileError, build, fail  # noqa: E402


def hosts_of(inventory: str) -> list[tuple[str, dict]]:
    module = runpy.run_path(inventory)
    found = []
    for key, value in module.items():
        if key.startswith("_") or not isinstance(value, list):
            continue
        found += [e for e in value if isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], dict)]
    return found


def rows(name: str, data: dict) -> list[tuple[str, str, str]]:
    try:
        profile = build(name, data, api_key_present=True)  # the key is the deploy's to check, not show's
    except ProfileError as e:
        fail(e)
    platform = data.get("platform", KNOBS["platform"].default)
    out = []
    for key in KNOBS:
        if key in data:
            source = "inventory"
        elif key in PLATFORMS[platform]:
            source = f"platform {platform}"
        else:
            source = "default"
        out.append((key, json.dumps(getattr(profile, key)), source))
    out += [(key, json.dumps(value), "inventory (pyinfra)") for key, value in data.items() if is_pyinfra_key(key)]
    return out


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv[1:2] in (["-h"], ["--help"]) else 2
    inventory, wanted = argv[1], (argv[2] if len(argv) == 3 else "")
    if not os.path.isfile(inventory):
        print(f"show: {inventory}: no such inventory file", file=sys.stderr)
        return 2
    entries = hosts_of(inventory)
    names = [n for n, _ in entries]
    if wanted:
        entries = [e for e in entries if e[0] == wanted]
    if len(entries) != 1:
        which = f"{wanted!r} is not one of" if wanted else "name one of"
        print(f"show: {which} {inventory}'s hosts: {', '.join(names)} (make show ... HOST=<name>)", file=sys.stderr)
        return 2
    name, data = entries[0]
    table = rows(name, data)
    width = max(len(k) for k, _, _ in table)
    print(f"# {name} ({inventory})")
    for key, value, source in table:
        print(f"{key:<{width}}  {value}  # {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
