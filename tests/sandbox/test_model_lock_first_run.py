"""The first real deploy of a moving revision writes its lock entry; --dry writes nothing.

locks/model.json ships empty. With model_revision `main` (the default on a real box) and no
entry, a dry run asks the hub nothing and leaves the lock as it is; the first real run asks
the stand-in hub once (sandbox/fake_hub.py: the real hub's model-info API, on loopback),
records the commit, says so, and converges; the next run asks the hub nothing and changes
nothing. The checkout's lock is put back afterwards.
"""

from __future__ import annotations

import json

import pytest

from control.model_lock import LOCK
from tests.conftest import REPO, SANDBOX_INVENTORY, changed_operations, pyinfra

pytestmark = pytest.mark.sandbox
HUB_LOG = REPO / ".sandbox" / "hub.log"
HUB_INFO = REPO / ".sandbox" / "hub" / "hub.json"  # written when the session boots the sandbox: read in the test


def revision_asks() -> int:
    """Requests the stand-in hub answered for a revision's commit (the model-info API)."""
    if not HUB_LOG.exists():
        return 0
    return sum("/revision/" in json.loads(line)["path"] for line in HUB_LOG.read_text().splitlines() if line.strip())


def run(*extra: str):
    return pyinfra(*extra, "--data", "model_revision=main", SANDBOX_INVENTORY, "deploy.py")


@pytest.fixture
def empty_lock(sandbox):
    kept = LOCK.read_bytes()
    LOCK.write_text("{}\n")
    try:
        yield
    finally:
        LOCK.write_bytes(kept)
        again = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")  # the inventory's pinned commit again
        assert again.returncode == 0, again.stderr[-4000:]


def test_dry_run_resolves_nothing_and_writes_nothing(empty_lock):
    asked = revision_asks()
    dry = run("--dry")
    assert dry.returncode == 0, dry.stderr[-4000:]
    assert LOCK.read_text() == "{}\n"
    assert revision_asks() == asked, "a dry run asked the hub"
    assert "dry run: the real run asks the hub once for its commit and records it in locks/model.json" in dry.stderr


def test_first_real_run_writes_the_lock_then_converges(empty_lock):
    hub = json.loads(HUB_INFO.read_text())
    asked = revision_asks()
    first = run("--json")
    assert first.returncode == 0, first.stderr[-4000:]
    assert json.loads(LOCK.read_text()) == {hub["repo"]: {"main": hub["commit"]}}
    assert revision_asks() == asked + 1, "the hub is asked once"
    assert f"{hub['repo']}@main is now locked to {hub['commit']}" in first.stderr
    assert "Keep locks/model.json with your inventory (commit it" in first.stderr
    second = run("--json")
    assert second.returncode == 0, second.stderr[-4000:]
    assert changed_operations(second.stdout) == []
    assert revision_asks() == asked + 1, "a locked revision is not asked again"
    assert "is now locked" not in second.stderr
