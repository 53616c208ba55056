"""Patch sets read and rendered on the control machine (patches/; uploaded by roles/engines/kt/patches.py
and roles/engines/vllm/engine.py as the JSON the host's glm-flash-patch reads).

A set's edits marked `template: true` have their replace text rendered from the host profile
(jinja2, strict: an unknown name is an error).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jinja2
import yaml

from control import layout
from control.profile import Profile

REPO = layout.REPO
PATCHES = layout.PATCHES


class PatchSetError(Exception):
    """No patch set for the installed version, or a set that cannot be rendered."""


def _load(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise PatchSetError(f"{path.relative_to(REPO)}: not valid YAML ({e})") from None
    if not isinstance(data, dict) or not data.get("name") or not isinstance(data.get("files"), list):
        raise PatchSetError(f"{path.relative_to(REPO)}: a patch set needs a name and a list of files")
    return data


_JINJA = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


def render(raw: dict, values: dict, root: str) -> dict:
    """The set as the host tool reads it: templated edits rendered, root set."""
    pset = copy.deepcopy(raw)
    pset["root"] = root
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


def patch_set(profile: Profile, env_dir: str, version: str) -> dict:
    """The rendered set of a run: the engine's for sglang-kt `version` (what the lock installs).
    The checkpoint is never edited: what the engine needs of it is an edit to the engine."""
    path = PATCHES / "sglang-kt" / f"{version}.yaml"
    if not path.exists():
        there = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise PatchSetError(
            f"no engine patch set for sglang-kt {version} (patches/sglang-kt/{version}.yaml); "
            f"there are sets for {', '.join(there) or 'no version'}. Write one for "
            f"{version} (check each anchor against that version's files), or pick engine_set "
            f"from those versions"
        )
    raw = _load(path)
    if str(raw.get("version")) != version:
        raise PatchSetError(f"{path.relative_to(REPO)} says version {raw.get('version')!r}, expected {version!r}")
    return render(raw, profile.as_dict(), layout.site_packages(profile, env_dir))


def set_json(pset: dict) -> str:
    return json.dumps(pset, indent=1, sort_keys=True) + "\n"
