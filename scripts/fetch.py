"""Fetch what a deploy uploads, before the deploy: `make fetch [INVENTORY=inventory/l40s.py]`.

For every L40S host of the inventory: the engine's CPython packed into the cache (uv downloads
it for python_release), and every file of its engine lock into ${GLM_FLASH_CACHE}/wheelhouse,
sha256-checked. The deploy does the same on its real run when something is missing; a dry run
never does. A network failure is one line: what, from where.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from control.engine_lock import LockError, fetch, load_lock  # noqa: E402
from control.profile import ProfileError, build  # noqa: E402
from control.pypi_cache import FetchError, progress  # noqa: E402
from control.python_pack import PythonSourceError, artifact  # noqa: E402


def main(inventory: str) -> int:
    done = set()
    try:
        for name, data in runpy.run_path(inventory)["hosts"]:
            profile = build(name, data, api_key_present=False)
            if profile.platform != "l40s" or (profile.engine_set, profile.python_source) in done:
                continue
            done.add((profile.engine_set, profile.python_source))
            art = artifact(profile)
            wheels = fetch(load_lock(profile.engine_set)[1])
            progress(f"{name}: {art.name} and {len(wheels)} files of engine_set {profile.engine_set} are cached")
    except (FetchError, LockError, PythonSourceError, ProfileError) as e:
        print(f"glm-flash: fetch: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "inventory/l40s.py"))
