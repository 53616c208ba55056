"""Edits to the installed engine and the model's config.json, as data (patches/), per version.

For the sglang-kt version installed in an engine environment:
- patches/sglang-kt/<version>.yaml: the engine edits (paths under site-packages);
- the model sets it names under `model_patches` (patches/model/<name>.yaml, root model_path).
Edits marked `template: true` have their replace text rendered from the host profile
(jinja2, strict: an unknown name is an error; control/patch_sets.py). Every set is uploaded as JSON into the
environment (`<env_dir>/glm-flash-patches/`), checked on the host by one
`glm-flash-patch check --json` over all sets of the run, and applied by one
`glm-flash-patch apply` over all of them only when something is pending: the tool checks
every file of every set before it writes any, so one changed upstream file refuses the
whole run (message: package, version, file, patch) and leaves every file as it was.
The manifests (package version, file hashes) land in root's own state directory
(control/layout.py PATCH_STATE), which the service user cannot write.

roles/engines/kt/engine.py calls apply(profile, env_dir, version) on the environment it deploys, before
it switches `current`, on every run (a no-op unless something drifted); roles/engines/vllm/engine.py
uploads its one set and calls engine_patched itself.
"""

from __future__ import annotations

import io

from control import layout
from control.patch_sets import patch_sets, set_json
from control.profile import Profile
from roles.operations import paths
from roles.operations.engine_patches import engine_patched

SET_DIR_NAME = layout.PATCH_SET_DIR
STATE_DIR = layout.PATCH_STATE  # glm-flash-patch's own default; kept in sync by tests/unit/test_root_state_paths.py


def set_dir(env_dir: str) -> str:
    return f"{env_dir}/{SET_DIR_NAME}"


def apply(profile: Profile, env_dir: str, version: str) -> None:
    """Upload the sets for sglang-kt `version` into `env_dir` and apply them when pending;
    PatchSetError when there is no set for that version (the caller refuses the host)."""
    sets = patch_sets(profile, env_dir, version)
    d = set_dir(env_dir)
    paths.directory(name=f"Patch sets directory {d}", path=d, mode="755", user="root", group="root")
    dests = []
    for pset in sets:
        dest = f"{d}/{pset['name']}.json"
        paths.put(
            name=f"Patch set {pset['name']} ({pset.get('package')} {pset.get('version')})",
            src=io.StringIO(set_json(pset)),
            dest=dest,
            mode="644",
            user="root",
            group="root",
        )
        dests.append(dest)
    engine_patched(
        name=f"Engine and model patched ({', '.join(p['name'] for p in sets)})",
        tool=layout.tool(profile, "glm-flash-patch"),
        sets=dests,
    )
