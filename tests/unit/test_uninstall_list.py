"""Every host path the deploy's code names is one the uninstall removes, or names as kept, or one
the deploy only reads (docs/uninstall.md): read from the source (roles/, control/layout.py,
control/defaults.py with ast; the host tools in files/ and the templates as text), so a new file
written by a role cannot be forgotten. The sandbox proof of the same (what a deploy really left)
is tests/sandbox/test_uninstall.py."""

from __future__ import annotations

import ast
import re

from control.profile import build
from roles import uninstall
from tests.conftest import REPO

HOST_PATH = re.compile(r"/(?:etc|var/lib|var/log|var/cache|opt|usr/local|srv)/[A-Za-z0-9._/+-]*")
# Paths the deploy reads or names without creating them (or a prefix of a built path).
NOT_CREATED = {
    "/etc/os-release",  # read (roles/facts/gb10.py)
    "/etc/apt/sources.list",  # Debian's legacy sources, moved aside and kept (docs/uninstall.md)
    "/var/lib/dkms/mok.pub",  # DKMS's own signing key, enrolled, never written by us
    "/var/lib/",  # prefix of the service user's home
    "/usr/local/sbin/",  # prefix of the host tools' links
    "/usr/local/cuda",  # the link the toolkit's owner chooses (files/glm-flash-nvidia-repo never sets it)
    "/usr/local/cuda-",  # prefix of the toolkit directory
    "/etc/systemd/",  # prefix, in roles/uninstall.py itself
    "/etc/systemd/system",  # systemd's directory of unit files (control/layout.py SYSTEMD_DIR), Debian's own
    "/usr/local/sbin",  # the links' directory (Debian's own)
    "/usr/local/bin",  # on PATH in the service environment (roles/toolkit.py)
    "/usr/local/cuda-X.Y",  # the toolkit directory, in prose
    "/usr/local/cuda-12",  # the header fix's glob over toolkits (files/glm-flash-fix-cuda-header)
    "/etc/dgx-release",  # read (roles/facts/gb10.py)
    "/etc/systemd/system/glm-flash-notify",  # the notifier's template unit (...@.service), cut at the @
    "/var/lib/dpkg/updates",  # dpkg's own journal, read to tell an interrupted dpkg (roles/facts/apt.py)
}


def named_paths() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    sources = [
        *REPO.glob("roles/**/*.py"),
        *REPO.glob("pyinfra_ext/*.py"),
        REPO / "control/layout.py",
        REPO / "control/defaults.py",
    ]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for m in HOST_PATH.finditer(node.value):
                    found.setdefault(m.group(0).rstrip(".:"), set()).add(str(path.relative_to(REPO)))
    for path in [*(p for p in REPO.glob("files/*") if p.is_file()), *REPO.glob("templates/**/*.j2")]:
        for m in HOST_PATH.finditer(path.read_text(errors="replace")):
            found.setdefault(m.group(0).rstrip(".:"), set()).add(str(path.relative_to(REPO)))
    return found


def covered(path: str, roots: list[str]) -> bool:
    return path in NOT_CREATED or any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def test_every_path_the_deploy_names_is_removed_or_kept():
    p = build("gpu1", {})
    roots = [
        *uninstall.removed_paths(p),
        *uninstall.nvidia_paths(p),
        *uninstall.checkpoints(p),
        "/etc/apt/sources.list.d/debian.sources",  # always kept, said so (KEPT_ALWAYS)
        *uninstall.KEPT_IF_PRESENT,  # kept and named when present
        # the GB10 platform's checkpoints (control/defaults.py PLATFORMS)
        *uninstall.checkpoints(
            build("gx10", {"platform": "gb10", "vllm_ref": "1" * 40, "accept_drafter_license": True})
        ),
    ]
    missing = {path: where for path, where in named_paths().items() if not covered(path, roots)}
    assert missing == {}, "named by the deploy, neither removed nor kept by roles/uninstall.py"


def test_the_always_kept_sources_file_is_the_one_base_writes():
    assert any("debian.sources" in k for k in uninstall.KEPT_ALWAYS)
    assert "/etc/apt/sources.list.d/debian.sources" in (REPO / "roles/base.py").read_text()


def test_the_host_tools_are_every_file_in_files():
    names = uninstall.host_tools()
    assert "glm-flash" in names and "glm-flash-model-fetch" in names and "glm-flash-fix-cuda-header" in names
    assert len(names) == len([p for p in (REPO / "files").iterdir() if p.is_file()])


def test_leftovers_parse_what_the_host_answers():
    from roles.facts.leftovers import Leftovers

    found = Leftovers.parse(
        [
            "path /opt/glm-flash",
            "unit glm-flash.service enabled",
            "unit glm-flash-flag-check-812.service transient",  # systemd-run's, while loaded
            "loaded glm-flash-job-engine-build.service loaded failed",
            "loaded glm-flash-notify@glm-flash.service.service not-found inactive",  # a name only
            "loaded glm-flash-gpu.service not-found failed",  # file gone, still failed: reset it
            "loaded glm-flash-gpu-metrics.service not-found activating",  # file gone, still running
            "user glm-flash",
            "group glm-flash-fetch",
            "owned /srv/models/GLM-5.3-Flash",
            "link /usr/local/sbin/glm-flash-rollback",
            "garbage",
        ]
    )
    assert found.paths == {"/opt/glm-flash"} and found.links == {"/usr/local/sbin/glm-flash-rollback"}
    assert found.units == {
        "glm-flash.service",
        "glm-flash-flag-check-812.service",
        "glm-flash-job-engine-build.service",
        "glm-flash-gpu.service",
        "glm-flash-gpu-metrics.service",
    }
    assert found.users == {"glm-flash"} and found.groups == {"glm-flash-fetch"}
    assert found.not_root_owned == {"/srv/models/GLM-5.3-Flash"}
    assert found.transient == {"glm-flash-flag-check-812.service"}
    assert Leftovers.parse([]) == Leftovers.default()
