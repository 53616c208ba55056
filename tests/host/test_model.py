"""The checkpoint and the secrets on a deployed node (sandbox or real host).

What roles/model.py and roles/operations/{checkpoint,secrets}.py leave: the checkpoint the
lock names, verified, root's and read-only to the service; the downloader's own user, not the
service's; no hub token anywhere; the secrets directory root-only; the API key root-only.
"""

from __future__ import annotations

import json
import shlex

import pytest

from control import layout
from control.model_lock import commit_for
from roles import model
from roles.operations.checkpoint import download_unit_path, token_file


@pytest.fixture
def _downloads(profile):
    """Only for the checks of what the download leaves (commit, seal, its user): the read-only,
    token and secrets checks hold for a staged checkpoint too."""
    if not profile.model_download:
        pytest.skip("not applicable: model_download is false (the checkpoint is staged by other means)")


@pytest.mark.usefixtures("_downloads")
def test_checkpoint_is_the_locked_commit_and_verified(host, profile):
    tool = layout.tool(profile, model.FETCH)
    commit = commit_for(profile.model_id, profile.model_revision)
    r = host.run(
        f"python3 {shlex.quote(tool)} check --dest {shlex.quote(profile.model_path)} "
        f"--repo {shlex.quote(profile.model_id)} --revision {shlex.quote(commit)}"
    )
    assert r.rc == 0, r.stdout + r.stderr
    state = json.loads(r.stdout)
    assert state["commit"] == commit and state["sealed"] is True


@pytest.mark.usefixtures("_downloads")
def test_downloaded_checkpoint_is_sealed_roots(host, profile):
    q = shlex.quote(profile.model_path)
    writable = host.run(f"find {q} \\( ! -user root -o -perm /022 -o -type l \\) -print -quit").stdout.strip()
    assert writable == ""


def test_checkpoint_is_read_only_to_the_service(host, profile):
    """Downloaded or staged: the service reads the checkpoint and can write nothing in it."""
    q = shlex.quote(profile.model_path)
    user = shlex.quote(profile.service_user)
    assert host.run(f"runuser -u {user} -- test -r {q}/config.json").rc == 0
    assert host.run(f"runuser -u {user} -- test -w {q}").rc != 0
    r = host.run(f"cd / && runuser -u {user} -- find {q} -writable -print -quit")
    assert r.rc == 0 and r.stdout.strip() == "", f"writable by the service: {r.stdout.strip()}"


@pytest.mark.usefixtures("_downloads")
def test_downloader_runs_as_its_own_user(host, profile):
    fetch = host.user(model.fetch_user(profile))
    assert fetch.exists and fetch.name != profile.service_user
    assert fetch.shell in ("/usr/sbin/nologin", "/sbin/nologin")
    assert profile.service_user not in fetch.groups


def test_no_token_left_and_secrets_root_only(host, profile):
    secrets = host.file(layout.SECRETS_DIR)  # made when a secret is first written
    if secrets.exists:
        assert secrets.is_directory and secrets.user == "root" and secrets.mode == 0o700
        assert host.run(f"ls -A {shlex.quote(layout.SECRETS_DIR)}").stdout.strip() == ""
    assert not host.file(token_file(model.MODEL_UNIT)).exists
    assert host.run("systemctl is-active glm-flash-model-download").stdout.strip() != "active"
    # the download's unit goes with its token once the checkpoint is complete: none is left enabled
    # to fetch again at the next boot
    for unit in (model.MODEL_UNIT, model.DRAFTER_UNIT):
        assert not host.file(download_unit_path(unit)).exists, f"{unit}.service is left after the download"
    key = host.file(f"{layout.CONF_DIR}/api-key")
    if key.exists:
        assert key.user == "root" and key.mode == 0o600
