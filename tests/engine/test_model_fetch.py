"""The model role's secret path and downloader, for real, without the internet.

- The token: an ansible-vault file encrypted here with ansible-core's own VaultLib,
  decrypted by roles/model.read_token with a password file (as on a control machine).
- The downloader: files/glm-flash-model-fetch with the hash-locked huggingface-hub
  (files/hf-hub-requirements.txt, in a cached venv) against a tiny fake hub on 127.0.0.1
  (sandbox/fake_hub.py, via HF_ENDPOINT) serving a tiny fake repo. The token comes as
  systemd hands a credential over (a file in $CREDENTIALS_DIRECTORY). While it runs, every
  process's command line and environment on this machine is read: the token must be in none.
- The checkpoint is never edited: a config.json an older release edited after the download is a
  change, and the next download fetches the hub's file again.
The real GLM-5.3-Flash repo cannot be reached from here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import pypi  # noqa: E402

from control import profile  # noqa: E402
from roles import model  # noqa: E402
from roles.operations import checkpoint  # noqa: E402
from sandbox import fake_model  # noqa: E402
from sandbox.fake_hub import FakeHub  # noqa: E402

FETCH = REPO / "files" / "glm-flash-model-fetch"
TOKEN = "hf_" + "Zq9" * 11  # looks like a token, unique enough to grep for
REPO_ID = "zai-org/GLM-5.3-Flash"


@pytest.fixture(scope="module")
def hub_python():
    """A venv with exactly the downloader's pins, built once under the cache."""
    req = REPO / "files" / "hf-hub-requirements.txt"
    key = hashlib.sha256(req.read_bytes()).hexdigest()[:12]
    venv = pypi.cache_dir() / f"hf-hub-{key}-venv"
    marker = venv / ".complete"
    if not marker.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [
                str(venv / "bin/pip"),
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--require-hashes",
                "-r",
                str(req),
            ],
            check=True,
            env=dict(os.environ, PIP_CONFIG_FILE="/dev/null"),
        )
        marker.write_text(req.read_text())
    return venv / "bin" / "python"


def repo_files():
    cfg = fake_model.config_text()
    shards = {f"model-0000{i}-of-00002.safetensors": os.urandom(200_000) for i in (1, 2)}
    index = {"metadata": {"total_size": 400_000}, "weight_map": {f"w{i}": n for i, n in enumerate(shards)}}
    return {
        "config.json": cfg.encode(),
        "model.safetensors.index.json": json.dumps(index).encode(),
        "tokenizer.json": b'{"version": "1.0"}',
        **shards,
    }


def fetch(hub_python, hub, dest, tmp_path, creds=None, wait_and_look=False, extra=()):
    env = {
        "PATH": os.environ["PATH"],
        "HF_ENDPOINT": hub.endpoint,
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
    }
    if creds:
        env["CREDENTIALS_DIRECTORY"] = str(creds)
    cmd = [str(hub_python), str(FETCH), "download", "--dest", str(dest), "--repo", REPO_ID, "--revision", hub.commit]
    cmd += ["--requested", "main", *extra]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    if wait_and_look:
        while p.poll() is None:
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    for what in ("cmdline", "environ"):
                        try:
                            seen.append(Path(f"/proc/{pid}/{what}").read_bytes())
                        except OSError:
                            pass
            time.sleep(0.05)
    out, err = p.communicate(timeout=300)
    return p.returncode, out, err, seen


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def check(dest, revision):
    r = subprocess.run(
        [sys.executable, str(FETCH), "check", "--dest", str(dest), "--repo", REPO_ID, "--revision", revision],
        capture_output=True,
        text=True,
    )
    return r.returncode, json.loads(r.stdout)


def test_vault_token_decrypts_with_the_password_file(tmp_path):
    from ansible.parsing.vault import VaultLib, VaultSecret

    pw = tmp_path / "vault-pass"
    pw.write_text("correct horse\n")
    secret = tmp_path / "hf-token.vault"
    secret.write_bytes(VaultLib([("default", VaultSecret(b"correct horse"))]).encrypt(f"hf_token: {TOKEN}\n"))
    assert TOKEN.encode() not in secret.read_bytes()
    prof = profile.build("t", {"hf_token_vault": str(secret)})
    assert model.read_token(prof, {"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)}) == TOKEN
    assert model.read_token(prof, {"GLM_FLASH_VAULT_PASSWORD": "correct horse"}) == TOKEN
    pw.write_text("wrong\n")
    with pytest.raises(model.ModelError, match="does not decrypt"):
        model.read_token(prof, {"ANSIBLE_VAULT_PASSWORD_FILE": str(pw)})
    with pytest.raises(model.ModelError, match="no vault password"):
        model.read_token(prof, {})
    plain = tmp_path / "plain"
    plain.write_text(TOKEN)
    with pytest.raises(model.ModelError, match="not ansible-vault encrypted"):
        model.read_token(profile.build("t", {"hf_token_vault": str(plain)}), {"GLM_FLASH_VAULT_PASSWORD": "x"})
    # no vault: the control machine's variable, or nothing
    assert model.read_token(profile.build("t", {}), {"HF_TOKEN": TOKEN}) == TOKEN
    assert model.read_token(profile.build("t", {}), {}) is None


def test_download_unit_hands_the_token_as_a_credential_only():
    cmd = checkpoint.download_unit_command(
        "glm-flash-model-download",
        "glm-flash-fetch",
        "/opt/glm-flash/tools/hf-hub/bin/python",
        "/opt/glm-flash/bin/glm-flash-model-fetch",
        ["download", "--dest", "/srv/models/x y", "--repo", REPO_ID, "--revision", "a" * 40],
        "/srv/models/x y",
        "https://huggingface.co",
        "/etc/glm-flash/secrets/hf-token-glm-flash-model-download",
    ).get_raw_value()
    assert cmd.startswith("since=$(date +%s); systemd-run --quiet --wait --collect")
    assert 'journalctl --no-pager -o cat -n 40 --since "@$since" -u glm-flash-model-download' in cmd
    assert "-p User=glm-flash-fetch" in cmd and "-p LoadCredential=hf-token:/etc/glm-flash/secrets/hf-token-" in cmd
    assert "'/srv/models/x y'" in cmd  # quoted by pyinfra, not by hand
    assert "HF_TOKEN=" not in cmd and "--token" not in cmd and "HF_TOKEN_PATH" not in cmd


def test_download_with_token_verified_resumable_and_token_never_in_argv(tmp_path, hub_python):
    files = repo_files()
    creds = tmp_path / "credentials"  # as systemd's LoadCredential= leaves it for the unit
    creds.mkdir(mode=0o700)
    (creds / "hf-token").write_text(TOKEN)
    (creds / "hf-token").chmod(0o400)
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, files, token=TOKEN, delay=0.002) as hub:
        code, out, err, seen = fetch(hub_python, hub, dest, tmp_path, creds, wait_and_look=True)
        assert code == 0, out + err
        assert len(seen) > 10
        assert not [c for c in seen if TOKEN.encode() in c]
        assert TOKEN not in out + err
        assert hub.requests and all(ok for _, _, ok in hub.requests)  # the token did reach the hub
        for name, data in files.items():
            assert (dest / name).read_bytes() == data
        marker = json.loads((dest / ".glm-flash-model.json").read_text())
        assert marker["commit"] == hub.commit and marker["repo"] == REPO_ID
        assert set(marker["files"]) == set(files)
        first = len(hub.downloads())
        assert first == len(files)

        # second run: nothing fetched again
        code, out, err, _ = fetch(hub_python, hub, dest, tmp_path, creds)
        assert code == 0, out + err
        assert len(hub.downloads()) == first

        # an interrupted download: what is there is kept, only the missing shard is fetched
        shard = "model-00002-of-00002.safetensors"
        (dest / ".glm-flash-model.json").unlink()
        (dest / shard).unlink()
        code, out, err, _ = fetch(hub_python, hub, dest, tmp_path, creds)
        assert code == 0, out + err
        assert (dest / shard).read_bytes() == files[shard]
        assert len(hub.downloads()) == first + 1

    code, state = check(dest, "main")  # the name it was locked from
    assert code == 0 and state["state"] == "complete" and state["commit"] == hub.commit
    code, state = check(dest, "0123456789abcdef0123456789abcdef01234567")
    assert code == 1 and "not downloaded from" in state["reason"]


def test_a_config_an_older_release_edited_is_fetched_again_from_the_hub(tmp_path, hub_python):
    """Releases before the engine edit changed config.json after the download (index sharing for
    MTP set false, root's patch manifest recording it). Nothing is edited any more, and no manifest
    is read: on a host upgraded from one of them the check calls that file changed, and the next
    download fetches the hub's config.json again, that file only."""
    files = repo_files()
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, files) as hub:
        code, out, err, _ = fetch(hub_python, hub, dest, tmp_path)
        assert code == 0, out + err
        before = len(hub.downloads())
        hubs = (dest / "config.json").read_text()
        assert '"index_share_for_mtp_iteration": true' in hubs
        # what the older release's model patch set left: both values false, root's manifest recording it
        edited = hubs.replace('"index_share_for_mtp_iteration": true', '"index_share_for_mtp_iteration": false')
        (dest / "config.json").write_text(edited)
        state = tmp_path / "root-state" / "manifests"
        state.mkdir(parents=True)
        (state / "glm-5.3-flash-index-share.json").write_text(
            json.dumps(
                {"files": {str(dest / "config.json"): {"original_sha256": sha(hubs), "patched_sha256": sha(edited)}}}
            )
        )
        code, state = check(dest, hub.commit)
        assert code == 1 and "changed" in state["reason"], state
        code, out, err, _ = fetch(hub_python, hub, dest, tmp_path)
        assert code == 0, out + err
        assert (dest / "config.json").read_bytes() == files["config.json"]
        assert len(hub.downloads()) == before + 1 and "fetching 1" in out + err
        assert check(dest, hub.commit)[0] == 0


def test_seal_makes_the_tree_roots_and_read_only_to_others(tmp_path):
    d = fake_model.write_model(tmp_path / "m")
    nobody = 65534
    for p in [d, *d.rglob("*")]:
        os.chown(p, nobody, nobody)
        os.chmod(p, 0o777 if p.is_dir() else 0o666)
    (d / "planted").symlink_to("/etc/shadow")
    r = subprocess.run([sys.executable, str(FETCH), "check", "--dest", str(d)], capture_output=True, text=True)
    assert json.loads(r.stdout)["sealed"] is False
    r = subprocess.run([sys.executable, str(FETCH), "seal", "--dest", str(d)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (d / "planted").is_symlink() and os.stat("/etc/shadow").st_uid == 0
    for p in [d, *d.rglob("*")]:
        st = os.lstat(p)
        assert st.st_uid == 0 and st.st_mode & 0o022 == 0, p
    r = subprocess.run([sys.executable, str(FETCH), "check", "--dest", str(d)], capture_output=True, text=True)
    assert json.loads(r.stdout)["sealed"] is True


def test_gated_repo_without_token_says_what_to_do(tmp_path, hub_python):
    with FakeHub(REPO_ID, repo_files(), token=TOKEN) as hub:
        code, out, err, _ = fetch(hub_python, hub, tmp_path / "model", tmp_path)
    assert code == 3 and "gated" in out and "hf_token_vault" in out and "Traceback" not in err
    assert not (tmp_path / "model" / ".glm-flash-model.json").exists()


def test_corrupt_file_fails_verification_and_writes_no_marker(tmp_path, hub_python):
    with FakeHub(REPO_ID, repo_files(), corrupt="model-00001-of-00002.safetensors") as hub:
        code, out, err, _ = fetch(hub_python, hub, tmp_path / "model", tmp_path)
    assert code != 0, out + err
    assert "model-00001-of-00002.safetensors" in out + err
    assert not (tmp_path / "model" / ".glm-flash-model.json").exists()


def test_staged_model_check(tmp_path):
    d = fake_model.write_model(tmp_path / "m")
    r = subprocess.run([sys.executable, str(FETCH), "check", "--dest", str(d)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    (d / "model-00002-of-00002.safetensors").unlink()
    r = subprocess.run([sys.executable, str(FETCH), "check", "--dest", str(d)], capture_output=True, text=True)
    assert r.returncode == 1 and "1 of 2 shards missing" in json.loads(r.stdout)["reason"]
    (d / "config.json").unlink()
    r = subprocess.run([sys.executable, str(FETCH), "check", "--dest", str(d)], capture_output=True, text=True)
    assert r.returncode == 1 and "config.json is missing" in json.loads(r.stdout)["reason"]


def test_unsharded_checkpoint_such_as_the_drafter_is_complete(tmp_path):
    d = tmp_path / "drafter"
    d.mkdir()
    (d / "config.json").write_text("{}")
    r = subprocess.run([sys.executable, str(FETCH), "check", "--dest", str(d)], capture_output=True, text=True)
    assert r.returncode == 1 and "model.safetensors.index.json is missing" in json.loads(r.stdout)["reason"]
    (d / "model.safetensors").write_bytes(b"\0" * 8)
    r = subprocess.run([sys.executable, str(FETCH), "check", "--dest", str(d)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


SHARD = "model-00001-of-00002.safetensors"
CUT = 300_000  # bytes of the shard sent before the link goes


def big_repo():
    files = repo_files()
    files[SHARD] = os.urandom(1_000_000)
    return files


MIB = 1 << 20


def test_a_dropped_connection_mid_file_costs_the_bytes_since_the_last_10_mib(tmp_path, hub_python):
    """#21.5, measured: the link goes once, 15 MiB into a 24 MiB shard. huggingface-hub 1.33 asks
    again by itself (HTTP Range) from the last whole 10 MiB block it wrote (it reads the body in
    10 MiB blocks, DOWNLOAD_CHUNK_SIZE): the 5 MiB after it are fetched twice. (Its Xet backend is
    not covered: the stand-in hub serves HTTP only.)"""
    files = repo_files()
    files[SHARD] = os.urandom(24 * MIB)
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, files, drop_file=SHARD, drops=[15 * MIB]) as hub:
        code, out, err, _ = fetch(hub_python, hub, dest, tmp_path)
        assert code == 0, out + err
        assert hub.drops == [], "the link never went: the test proves nothing"
        assert (dest / SHARD).read_bytes() == files[SHARD]
        lost = hub.served[SHARD] - len(files[SHARD])
    assert "Trying to resume download" in err  # huggingface-hub's own retry, with a Range request
    assert lost == 5 * MIB, f"a drop 15 MiB into the file cost {lost} bytes"


def test_an_outage_longer_than_huggingface_hubs_retries_ends_the_run_and_the_next_fetches_the_rest(
    tmp_path, hub_python
):
    """#21.5, measured: the link goes 300 kB into a 1 MB shard and stays down for huggingface-hub's
    own five quick retries (1 s apart). It then gives up and discards its partial file; the tool
    says what failed in one line and exits 5, which its unit restarts (systemd's backoff,
    tests/sandbox/test_model_download.py); the next run fetches the shard again from its first
    byte, and only it. Lost: exactly the 300 kB that had arrived, i.e. what was in flight. Progress
    lines meanwhile."""
    files = big_repo()
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, files, drop_file=SHARD, drops=[CUT] + [0] * 5, delay=0.001) as hub:
        code, out, err, _ = fetch(hub_python, hub, dest, tmp_path, extra=["--every", "0.5"])
        assert code == 5, out + err
        assert "download failed: RemoteProtocolError" in out and "systemd starts the download again" in out
        assert "Traceback" not in err, err
        assert not (dest / ".glm-flash-model.json").exists() and not (dest / SHARD).exists()
        progress = [line for line in out.splitlines() if " of " in line and "/s, ETA " in line]
        assert progress, out  # bytes done of total, rate, time left
        before = {p: (dest / p).stat().st_mtime_ns for p in files if (dest / p).exists()}
        assert before, "nothing finished before the outage: the test proves nothing"
        code, out, err, _ = fetch(hub_python, hub, dest, tmp_path, extra=["--every", "0.5"])
        assert code == 0, out + err
        assert hub.drops == []
        assert (dest / SHARD).read_bytes() == files[SHARD]
        lost = hub.served[SHARD] - len(files[SHARD])
    assert f"{len(files) - 1} files already here and verified; fetching 1" in out, out
    assert {p: (dest / p).stat().st_mtime_ns for p in before} == before  # the finished files were kept
    assert lost == CUT, f"expected to lose the {CUT} bytes in flight, lost {lost}"
    assert "fetched 976.6 KiB in" in out, out


def test_a_hub_that_is_down_ends_the_run_with_exit_5_and_no_marker(tmp_path, hub_python):
    files = big_repo()
    dest = tmp_path / "model"
    with FakeHub(REPO_ID, files, drop_file=SHARD, drops=[0] * 100) as hub:
        code, out, err, _ = fetch(hub_python, hub, dest, tmp_path)
    assert code == 5, out + err
    assert "download failed:" in out and "the files that finished are kept" in out
    assert not (dest / ".glm-flash-model.json").exists()
