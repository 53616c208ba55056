"""Edits to the installed engine, as data (patches/sglang-kt/<version>.yaml, paths under
site-packages), for the sglang-kt version installed in an engine environment. The checkpoint is
never edited: what the engine needs of it (index sharing for MTP, which post1 refuses) is an edit
to the engine.

Edits marked `template: true` have their replace text rendered from the host profile
(jinja2, strict: an unknown name is an error; control/patch_sets.py). The set is uploaded as JSON
into the environment (`<env_dir>/glm-flash-patches/`), checked on the host by
`glm-flash-patch check --json`, and applied by `glm-flash-patch apply` only when something is
pending: the tool checks every file before it writes any, so one changed upstream file refuses the
whole run (message: package, version, file, patch) and leaves every file as it was.
The manifests (package version, file hashes) land in root's own state directory
(control/layout.py PATCH_STATE), which the service user cannot write.

roles/engines/kt/engine.py calls apply(profile, env_dir, version) on the environment it deploys, before
it switches `current`, on every run (a no-op unless something drifted).
"""

from __future__ import annotations

import io

from control import layout
from control.patch_sets import patch_set, set_json
from control.profile import Profile
from roles.operations import paths
from roles.operations.engine_patches import engine_patched

SET_DIR_NAME = layout.PATCH_SET_DIR
# The set that edited the checkpoint's config.json, shipped until the engine edit replaced it: an
# environment deployed before keeps its JSON beside the engine's set, where `glm-flash status`
# checks every set it finds. The checkpoint itself needs nothing: the downloader fetches the
# hub's config.json again (it no longer matches), a staged one holds a value the engine accepts.
RETIRED_SETS = ["glm-5.3-flash-index-share"]
STATE_DIR = layout.PATCH_STATE  # glm-flash-patch's own default; kept in sync by tests/unit/test_root_state_paths.py


def set_dir(env_dir: str) -> str:
    return f"{env_dir}/{SET_DIR_NAME}"


def apply(profile: Profile, env_dir: str, version: str) -> None:
    """Upload the set for sglang-kt `version` into `env_dir` and apply it when pending;
    PatchSetError when there is no set for that version (the caller refuses the host)."""
    pset = patch_set(profile, env_dir, version)
    d = set_dir(env_dir)
    paths.directory(name=f"Patch sets directory {d}", path=d, mode="755", user="root", group="root")
    dest = f"{d}/{pset['name']}.json"
    paths.put(
        name=f"Patch set {pset['name']} ({pset.get('package')} {pset.get('version')})",
        src=io.StringIO(set_json(pset)),
        dest=dest,
        mode="644",
        user="root",
        group="root",
    )
    for name in RETIRED_SETS:
        paths.absent(f"{d}/{name}.json", name=f"No retired patch set {name} in {d}")
    engine_patched(name=f"Engine patched ({pset['name']})", tool=layout.tool(profile, "glm-flash-patch"), sets=[dest])
