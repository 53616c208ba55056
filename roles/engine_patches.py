"""Edits to the installed engine and the model's config.json, as data (patches/), per version.

For the sglang-kt version installed in an engine environment:
- patches/sglang-kt/<version>.yaml: the engine edits (paths under site-packages);
- the model sets it names under `model_patches` (patches/model/<name>.yaml, root model_path).
Edits marked `template: true` have their replace text rendered from the host profile
(jinja2, strict: an unknown name is an error). Every set is uploaded as JSON into the
environment (`<env_dir>/glm-flash-patches/`), checked on the host by one
`glm-flash-patch check --json` over all sets of the run, and applied by one
`glm-flash-patch apply` over all of them only when something is pending: the tool checks
every file of every set before it writes any, so one changed upstream file refuses the
whole run (message: package, version, file, patch) and leaves every file as it was.
The manifests (package version, file hashes) land in root's own state directory
(control/layout.py PATCH_STATE), which the service user cannot write.

roles/engine_kt.py calls apply(profile, env_dir, version) on the environment it deploys, before
it switches `current`, on every run (a no-op unless something drifted); roles/engine_vllm.py
uploads its one set and calls engine_patched itself.
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import jinja2
import yaml
from pyinfra.operations import files

from control import layout
from control.profile import Profile
from roles.engine import site_packages
from roles.operations.engine_patches import engine_patched

REPO = Path(__file__).resolve().parent.parent
PATCHES = REPO / "patches"
SET_DIR_NAME = "glm-flash-patches"
STATE_DIR = layout.PATCH_STATE  # glm-flash-patch's own default; kept in sync by tests/unit/test_root_state_paths.py


class PatchSetError(Exception):
    """No patch set for the installed version, or a set that cannot be rendered."""


def available_versions(package: str = "sglang-kt") -> list[str]:
    return sorted(p.stem for p in (PATCHES / package).glob("*.yaml"))


def _load(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise PatchSetError(f"{path.relative_to(REPO)}: not valid YAML ({e})") from None
    if not isinstance(data, dict) or not data.get("name") or not isinstance(data.get("files"), list):
        raise PatchSetError(f"{path.relative_to(REPO)}: a patch set needs a name and a list of files")
    return data


_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


def render(raw: dict, values: dict, root: str, version: str | None = None) -> dict:
    """The set as the host tool reads it: templated edits rendered, root (and version) set."""
    pset = copy.deepcopy(raw)
    pset.pop("model_patches", None)
    pset["root"] = root
    if version is not None:
        pset["version"] = version
    for spec in pset["files"]:
        for edit in spec.get("edits", []):
            if edit.pop("template", False):
                try:
                    edit["replace"] = _JINJA.from_string(edit["replace"]).render(**values)
                except jinja2.TemplateError as e:
                    raise PatchSetError(
                        f"patch set {pset['name']}, edit {edit.get('id')!r}: cannot render "
                        f"the replace text from the profile ({e})"
                    ) from None
    return pset


def patch_sets(profile: Profile, env_dir: str, version: str) -> list[dict]:
    """Every rendered set of a run: the engine's for sglang-kt `version` (what the lock
    installs), then its model sets."""
    path = PATCHES / "sglang-kt" / f"{version}.yaml"
    if not path.exists():
        raise PatchSetError(
            f"no engine patch set for sglang-kt {version} (patches/sglang-kt/{version}.yaml); "
            f"there are sets for {', '.join(available_versions()) or 'no version'}. Write one for "
            f"{version} (check each anchor against that version's files), or pick engine_set "
            f"from those versions"
        )
    raw = _load(path)
    if str(raw.get("version")) != version:
        raise PatchSetError(f"{path.relative_to(REPO)} says version {raw.get('version')!r}, expected {version!r}")
    values = profile.as_dict()
    sets = [render(raw, values, site_packages(profile, env_dir))]
    for name in raw.get("model_patches") or []:
        mpath = PATCHES / "model" / f"{name}.yaml"
        if not mpath.exists():
            raise PatchSetError(
                f"{path.relative_to(REPO)} names model patch {name!r}, but patches/model/{name}.yaml does not exist"
            )
        sets.append(render(_load(mpath), values, profile.model_path, version=profile.model_revision))
    return sets


def set_json(pset: dict) -> str:
    return json.dumps(pset, indent=1, sort_keys=True) + "\n"


def set_dir(env_dir: str) -> str:
    return f"{env_dir}/{SET_DIR_NAME}"


def apply(profile: Profile, env_dir: str, version: str) -> None:
    """Upload the sets for sglang-kt `version` into `env_dir` and apply them when pending;
    PatchSetError when there is no set for that version (the caller refuses the host)."""
    sets = patch_sets(profile, env_dir, version)
    d = set_dir(env_dir)
    files.directory(name=f"Patch sets directory {d}", path=d, mode="755", user="root", group="root")
    dests = []
    for pset in sets:
        dest = f"{d}/{pset['name']}.json"
        files.put(
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
