"""The CUDA 12.x crt/math_functions.h fix for glibc >= 2.41 (docs/sources.md §6).

Installs `glm-flash-fix-cuda-header` beside glm-flash-patch, the patch set
(patches/cuda/math_functions-12.yaml, uploaded as JSON) and a dpkg hook that re-applies
the fix after every dpkg run (a toolkit upgrade rewrites the header). Every deploy checks
the headers through the command's `--check` and runs the fix only when that says so:
a second deploy reports no change.

Needs roles/tools.py first (it installs glm-flash-patch into the same bin directory).
"""

from __future__ import annotations

import io
import json

import yaml

from control import layout
from control.profile import Profile
from control.report import skipped
from roles.operations import paths
from roles.operations.cuda_header import headers_fixed
from roles.operations.uploads import host_tool, template

PATCH_YAML = layout.PATCHES / "cuda" / "math_functions-12.yaml"
TOOL = "glm-flash-fix-cuda-header"
HOOK = "/etc/apt/apt.conf.d/60glm-flash-cuda-header"
HOOK_LOG = layout.CUDA_HEADER_LOG


def locations(profile: Profile) -> dict[str, str]:
    return {"tool": layout.tool(profile, TOOL), "patch_set": layout.cuda_patch_set(profile)}


def patch_set_json() -> str:
    """The patch set as the host tools read it (JSON, stdlib only on the host)."""
    return json.dumps(yaml.safe_load(PATCH_YAML.read_text()), indent=1, sort_keys=True) + "\n"


def apply(profile: Profile) -> None:
    p = locations(profile)
    if not profile.fix_cuda_header:
        paths.absent(HOOK, name="No CUDA header dpkg hook (fix_cuda_header is false)")
        skipped("CUDA 12.x header fix", "fix_cuda_header is false in the profile")
        return
    bin_dir = layout.bin_dir(profile)
    paths.directory(name="Host tools directory", path=bin_dir, mode="755")
    host_tool(TOOL, bin_dir)
    paths.link(name=f"Link {layout.SBIN}/{TOOL}", path=f"{layout.SBIN}/{TOOL}", target=p["tool"])
    paths.directory(name="Patch sets directory", path=layout.cuda_patch_dir(profile), mode="755")
    paths.put(
        name=f"Install {p['patch_set']}",
        src=io.StringIO(patch_set_json()),
        dest=p["patch_set"],
        mode="644",
        user="root",
        group="root",
    )
    template(
        "apt/60glm-flash-cuda-header.j2",
        HOOK,
        name="dpkg hook: re-fix the CUDA header after upgrades",
        tool=p["tool"],
        log=HOOK_LOG,
    )
    headers_fixed(name="CUDA 12.x math_functions.h fixed for glibc >= 2.41", tool=p["tool"])
