"""Root's own state on a deployed node: only root can write it, the service user cannot.

Root's patch manifests, kept originals and markers live in control/layout.py ROOT_STATE, never
in the service user's home; every directory above it is root's; the service user (a real
account on the host) can neither create nor replace anything there, and every manifest it holds
accounts for files that are really on disk.
"""

from __future__ import annotations

import json
import shlex

from control import layout


def test_root_state_is_roots_alone(host, profile):
    for path in ("/var", "/var/lib", layout.ROOT_STATE):
        d = host.file(path)
        assert d.is_directory and not d.is_symlink, path
        assert d.user == "root" and d.mode & 0o022 == 0, f"{path}: {d.user} {oct(d.mode)}"
    others = host.run(f"find {shlex.quote(layout.ROOT_STATE)} ! -user root -o -perm /022 ! -type l")
    assert others.stdout == "", f"not root's alone:\n{others.stdout}"
    assert not layout.ROOT_STATE.startswith(layout.service_home(profile) + "/")


def test_service_user_cannot_write_root_state(host, profile):
    user = shlex.quote(profile.service_user)
    assert host.run(f"id -u {user}").rc == 0, "the service user exists"
    for attempt in (
        f"touch {layout.ROOT_STATE}/probe",
        f"ln -s /etc/shadow {layout.ROOT_STATE}/patches/.lock",
        f"mv {layout.ROOT_STATE}/patches {layout.ROOT_STATE}/p2",
    ):
        r = host.run(f"runuser -u {user} -- {attempt}")
        assert r.rc != 0, f"the service user could: {attempt}"


def test_manifests_account_for_files_on_disk(host):
    listing = host.run(f"ls {layout.PATCH_STATE}/manifests/*.json 2>/dev/null")
    for m in listing.stdout.split():
        data = json.loads(host.file(m).content_string)
        for path, entry in data["files"].items():
            assert entry.get("state", "done") == "done", f"{m}: {path} left half done"
            if host.file(path).exists:
                kept = host.file(entry["original_copy"])
                assert entry["original_copy"].startswith(layout.PATCH_STATE + "/originals/")
                assert kept.exists and kept.user == "root", entry["original_copy"]
                assert (
                    host.run(f"sha256sum {shlex.quote(entry['original_copy'])}").stdout.split()[0]
                    == (entry["original_sha256"])
                )
