"""The service user cannot steer what root writes: links planted by the real service user, then a
real deploy and the real dpkg hook, in the booted Debian 13 sandbox.

The service user (glm-flash, a real unprivileged account) plants links wherever root used to
write in its home (the old patch state: manifests, kept originals, the CUDA header lock; the
nouveau marker; the token directory), pointing at root files (canaries, /etc/shadow). It also
tries to write into root's own state directory. Then the deploy runs, then apt installs a
package with a CUDA 12.x header so the dpkg hook patches it, then the deploy runs again: no
root file changed, the links were not followed, root's state is where layout.py says, the
second deploy changes nothing.

Migration: the test first makes the host look like one deployed by the old tools (root's patch
state gone from the new place, an old state directory in the service user's home holding an
attacker's "originals"); the deploy re-derives root's state from the patched files themselves.
Simulated: only the CUDA package (built here, as in test_cuda_header_hook.py).
"""

from __future__ import annotations

import hashlib

import pytest

from control import layout
from tests.conftest import SANDBOX_INVENTORY, changed_operations, pyinfra, sandbox_sh
from tests.sandbox.test_cuda_header_hook import HEADER, PKG, build_deb, cuda_assets, sh

pytestmark = pytest.mark.sandbox

USER = "glm-flash"
HOME = "/var/lib/glm-flash"
CANARY = "/root/glm-flash-canary"
CANARY_DIR = "/root/glm-flash-canary-dir"
# where the old layout had root write, in the service user's home -> what the link points at
PLANTS = {
    f"{HOME}/initramfs-nouveau.sha256": CANARY,
    f"{HOME}/patches/.cuda-header.lock": CANARY,
    f"{HOME}/patches/manifests": CANARY_DIR,
    f"{HOME}/patches/originals": CANARY_DIR,
    f"{HOME}/secrets": CANARY_DIR,
}
ROOT_FILES = ["/etc/shadow", CANARY, f"{CANARY_DIR}/manifest.json"]


def as_service(command: str, check: bool = True):
    return sandbox_sh(f"runuser -u {USER} -- sh -c {command!r}", check=check)


def fingerprint() -> str:
    """Hash, mode, owner, size and mtime of the canaries, and the canary directory's listing."""
    files = " ".join(ROOT_FILES)
    return sandbox_sh(
        f"sha256sum {files}; stat -c '%n %a %u %g %s %Y' {files}; find {CANARY_DIR} -printf '%p %m %u %s\\n' | sort"
    ).stdout


def deploy() -> list[str]:
    run = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")
    assert run.returncode == 0, run.stderr[-6000:]
    return changed_operations(run.stdout)


@pytest.fixture(scope="module")
def planted(sandbox, tmp_path_factory):
    header = cuda_assets.header_12_8().encode()
    cuda = build_deb(
        tmp_path_factory.mktemp("debs"),
        PKG,
        {HEADER: header},
        {"/usr/local/cuda-12.9/include": "targets/x86_64-linux/include"},
    )
    sh(f"dpkg --purge {PKG} >/dev/null")
    sh(f"cat > /tmp/{PKG}.deb", stdin=cuda.read_bytes())
    # canaries: root files a planted link would make root write
    sandbox_sh(
        f"printf 'x = 1\\n' > {CANARY} && chmod 600 {CANARY} && mkdir -p -m 700 {CANARY_DIR} && "
        f"printf '{{}}\\n' > {CANARY_DIR}/manifest.json && chmod 600 {CANARY_DIR}/manifest.json"
    )
    # a host as the old tools left it: root's patch state only in the service user's home
    old = f"{HOME}/patches"
    sandbox_sh(
        f"rm -rf {layout.PATCH_STATE} {layout.INITRAMFS_MARKER} {old} && "
        f"mkdir -p {old}/manifests {old}/originals && "
        f"printf '{{\"files\": {{}}}}' > {old}/manifests/evil.json"
    )
    # the service user takes the old state directory over and plants its links
    as_service(f"mv {old} {HOME}/patches.root && mkdir {old}")
    for link, target in PLANTS.items():
        as_service(f"rm -rf {link}; ln -s {target} {link}")
    yield fingerprint(), hashlib.sha256(header).hexdigest()
    sandbox_sh(f"DEBIAN_FRONTEND=noninteractive apt-get purge -y {PKG}", check=False)
    sandbox_sh(
        f"rm -rf {CANARY} {CANARY_DIR} {HOME}/patches.root " + " ".join(PLANTS) + f"; rmdir {HOME}/patches",
        check=False,
    )


def test_deploy_and_dpkg_hook_with_planted_links_change_no_root_file(planted):
    before, original_header = planted
    changed = deploy()
    # the migration: root's patch state re-derived from the patched files, in root's directory
    assert sandbox_sh(f"stat -c '%U:%G %a' {layout.ROOT_STATE} {layout.PATCH_STATE}").stdout.split("\n")[:2] == [
        "root:root 755",
        "root:root 755",
    ]
    manifests = sandbox_sh(f"ls {layout.PATCH_STATE}/manifests").stdout.split()
    assert any(m.startswith("sglang-kt-") for m in manifests), (manifests, changed)
    assert "evil.json" not in manifests, "nothing is carried over from the service user's home"
    assert sandbox_sh(f"find {layout.ROOT_STATE} ! -user root").stdout == ""
    for attempt in (f"touch {layout.ROOT_STATE}/x", f"ln -s {CANARY} {layout.PATCH_STATE}/.lock"):
        assert as_service(attempt, check=False).returncode != 0, f"the service user could: {attempt}"

    # the dpkg hook patches a freshly installed header, with the links still in place
    r = sandbox_sh(f"DEBIAN_FRONTEND=noninteractive apt-get install -y /tmp/{PKG}.deb")
    assert f"glm-flash: fixed     {HEADER}" in r.stdout + r.stderr, r.stdout + r.stderr
    kept = f"{layout.PATCH_STATE}/originals{HEADER}"
    assert sandbox_sh(f"sha256sum {kept}").stdout.split()[0] == original_header
    assert sandbox_sh("glm-flash-fix-cuda-header --check").returncode == 0

    assert deploy() == [], "converged: the next deploy changes nothing"
    assert fingerprint() == before, "a root file changed"
    for link, target in PLANTS.items():
        assert sandbox_sh(f"readlink {link}").stdout.strip() == target, f"{link} was replaced"


def test_patch_tool_refuses_the_planted_state_directory(planted):
    """The tool itself, pointed at the old, service-owned state: it refuses, nothing changes."""
    before = fingerprint()
    sets = sandbox_sh("ls /opt/glm-flash/engine/current/glm-flash-patches/*.json").stdout.split()
    r = sandbox_sh(
        f"GLM_FLASH_STATE_DIR={HOME}/patches /opt/glm-flash/bin/glm-flash-patch apply {' '.join(sets)}",
        check=False,
    )
    # every file is patched, and that directory records none of them: the tool must write there to
    # record them, and refuses to, since the service user owns the directory above it
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{HOME} can be changed by user {USER}" in r.stderr, r.stderr
    assert fingerprint() == before
