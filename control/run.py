"""How pyinfra was asked to run this deploy.

A dry run (`pyinfra --dry`, or `--json` without `--yes`, which pyinfra also stops before
executing) changes nothing anywhere, this machine included: no CPython is packed, no tools
venv built, no wheel fetched; the roles show what the real run would fetch. pyinfra keeps the
flag to its CLI (pyinfra_cli/cli.py), so it is read from the command line it was started with.
"""

from __future__ import annotations

import sys


def dry_run(argv: list[str] | None = None) -> bool:
    args = sys.argv[1:] if argv is None else argv
    return "--dry" in args or ("--json" in args and not {"-y", "--yes"} & set(args))
