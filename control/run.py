"""How pyinfra was asked to run this deploy.

A dry run (`pyinfra --dry`, or `--json` without `--yes`, which pyinfra also stops before
executing) changes nothing anywhere, this machine included: no CPython is packed, no tools
venv built, no wheel fetched; the roles show what the real run would fetch. pyinfra keeps the
flag to its CLI (pyinfra_cli/cli.py), so it is read from the command line it was started with,
and `-y` also from PYINFRA_YES, which pyinfra's CLI reads as `-y` (click's envvar for the flag).
"""

from __future__ import annotations

import os
import sys

# click's BoolParamType: the values it reads as true for a flag's environment variable.
TRUE = {"1", "true", "t", "yes", "y", "on"}


def yes(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> bool:
    """pyinfra was told to go on without asking: -y / --yes, or PYINFRA_YES."""
    args = sys.argv[1:] if argv is None else argv
    env = os.environ if environ is None else environ
    return bool({"-y", "--yes"} & set(args)) or env.get("PYINFRA_YES", "").strip().lower() in TRUE


def dry_run(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> bool:
    args = sys.argv[1:] if argv is None else argv
    return "--dry" in args or ("--json" in args and not yes(args, environ))


def json_output(argv: list[str] | None = None) -> bool:
    """pyinfra's stdout is JSON (--json): what we report for scripts goes there as JSON too."""
    return "--json" in (sys.argv[1:] if argv is None else argv)
