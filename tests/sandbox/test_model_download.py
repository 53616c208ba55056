"""The checkpoint downloaded for real in the sandbox, and secrets that never leak.

Simulated: the hub. sandbox/sandbox.py serves a small checkpoint with the real config.json
keys (sandbox/fake_model.py) from sandbox/fake_hub.py on loopback, and logs every request
it answers to .sandbox/hub.log; inventory/sandbox.py points the deploy at it (hf_endpoint).
The download itself is the real one: the hash-locked huggingface-hub in its venv on the host,
in its systemd unit (restarted by systemd when it fails) as the downloader's own user.

1. #10.1: a converged deploy changes nothing and asks the hub for nothing; config.json is the
   hub's, never edited (the engine is patched instead); the tree is root's, read-only to the service.
2. #9.3/#9.4: a canary API key and a canary hub token through a deploy that downloads (its
   marker removed first) with --diff and -vvv: neither is in pyinfra's output, in any
   process's command line or environment on the host while it runs, in the journal, or in a
   world-readable file of the machine (its whole root filesystem is scanned); the token file
   is gone afterwards. The deploy logs in as the sudo user `glm` with `_sudo` (issue 39), so
   sudo's command lines and its journal entries and logs are among those searched.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shlex
import stat
import string
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from control import layout
from control.profile import build
from roles import model
from roles.operations import checkpoint
from sandbox.fake_hub import FakeHub, read_dir
from tests.conftest import REPO, SANDBOX_INVENTORY, changed_operations, inventory_hosts, pyinfra, sandbox_sh

HUB_LOG = REPO / ".sandbox" / "hub.log"
ROOTFS = REPO / ".sandbox" / "rootfs"
# Minted for this run: a file that holds one was written during it (world_readable_hits reads only those).
API_KEY = "sk-canary-" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(24))
TOKEN = "hf_canary" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(27))
KILL_TOKEN = "hf_killtest" + "Jm8" * 9  # put on the host by the test itself, so not the canary


@pytest.fixture(scope="module")
def profile():
    name, data = inventory_hosts(SANDBOX_INVENTORY)[0]
    return build(name, data, api_key_present=False)


def hub_requests() -> list[dict]:
    return [json.loads(line) for line in HUB_LOG.read_text().splitlines()] if HUB_LOG.exists() else []


def deploy(*extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    if env is None:
        return pyinfra(*extra, SANDBOX_INVENTORY, "deploy.py")
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *extra, SANDBOX_INVENTORY, "deploy.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
        env=env,
    )


def test_converged_deploy_changes_nothing_and_asks_the_hub_nothing(sandbox, profile):
    assert profile.model_download, "inventory/sandbox.py must download (model_download true)"
    downloads = [r for r in hub_requests() if r["method"] == "GET" and "/resolve/" in r["path"]]
    assert downloads, "the deploy never downloaded from the sandbox's hub"
    seen = len(hub_requests())
    run = deploy("--json")
    assert run.returncode == 0, run.stderr[-4000:]
    assert changed_operations(run.stdout) == []
    assert len(hub_requests()) == seen, hub_requests()[seen:]
    q = shlex.quote(profile.model_path)
    text = sandbox_sh(f"cat {q}/config.json").stdout
    cfg = json.loads(text)
    assert cfg["index_share_for_mtp_iteration"] is True  # as the hub sent it
    assert cfg["text_config"]["index_share_for_mtp_iteration"] is True
    marker = json.loads(sandbox_sh(f"cat {q}/.glm-flash-model.json").stdout)
    assert hashlib.sha256(text.encode()).hexdigest() == marker["files"]["config.json"]["sha256"]


def test_checkpoint_is_roots_and_read_only_to_the_service(sandbox, profile):
    path = ROOTFS / profile.model_path.lstrip("/")
    entries = [path, *path.rglob("*")]
    assert len(entries) > 4
    for p in entries:
        st = os.lstat(p)
        assert st.st_uid == 0 and not st.st_mode & 0o022 and not stat.S_ISLNK(st.st_mode), p
    q = shlex.quote(profile.model_path)
    r = sandbox_sh(f"runuser -u {shlex.quote(profile.service_user)} -- touch {q}/x {q}/config.json", check=False)
    assert r.returncode != 0
    r = sandbox_sh(f"runuser -u {shlex.quote(profile.service_user)} -- cat {q}/config.json", check=False)
    assert r.returncode == 0  # the engine reads it


class HostWatch(threading.Thread):
    """Reads every process's command line and environment on the host while the deploy runs:
    grep with its patterns in a root-only file (so its own argv holds no canary)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.hits: list[str] = []
        self.rounds = 0
        self.stop = threading.Event()

    def run(self):
        cmd = "grep -l -a -F -f /root/canaries /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null; true"
        while not self.stop.is_set():
            r = sandbox_sh(cmd, check=False, timeout=60)
            self.hits += [line for line in r.stdout.splitlines() if line.strip()]
            self.rounds += 1
            time.sleep(0.2)


def holding(root: Path, since: Path, *needles: str) -> list[str]:
    """Files under root changed since `since` was made that hold one of the needles. The canaries
    are minted for this run, so only a file written during the test can hold one: the scan reads
    those (find -cnewer: a file's ctime cannot be set back), not the whole machine."""
    find = subprocess.Popen(
        ["find", str(root), "-xdev", "-type", "f", "-cnewer", str(since), "-print0"], stdout=subprocess.PIPE
    )
    grep = subprocess.run(
        ["xargs", "-0", "-r", "grep", "-laF", "--devices=skip", *[a for n in needles for a in ("-e", n)]],
        stdin=find.stdout,
        capture_output=True,
        text=True,
    )
    find.stdout.close()
    assert find.wait() == 0, "find could not walk the machine's files"
    return grep.stdout.splitlines()


def world_readable_hits(root: Path, since: Path) -> list[str]:
    """Files of the machine anyone may read that hold a canary."""
    hits = []
    for line in holding(root, since, API_KEY, TOKEN):
        p = Path(line)
        readable = p.stat().st_mode & stat.S_IROTH
        walk = all(d.stat().st_mode & stat.S_IXOTH for d in p.parents if d.is_relative_to(root) and d != root)
        if readable and walk:
            hits.append(line)
    return hits


def test_canary_secrets_never_leak(sandbox, profile, tmp_path):
    q = shlex.quote(profile.model_path)
    sandbox_sh(
        "umask 077; printf '%s\\n%s\\n' " + shlex.quote(API_KEY) + " " + shlex.quote(TOKEN) + " > /root/canaries"
    )
    sandbox_sh(f"rm -f {q}/.glm-flash-model.json")  # so this deploy downloads, with the token
    cursor = sandbox_sh("journalctl -n 0 --show-cursor | tail -1 | sed 's/^-- cursor: //'").stdout.strip()
    since = tmp_path / "stamp"
    since.touch()  # before the canaries reach anything on the machine (the test's own file is filtered below)
    time.sleep(0.01)
    env = dict(os.environ, PYTHONUNBUFFERED="1", GLM_FLASH_API_KEY=API_KEY, HF_TOKEN=TOKEN)
    watch = HostWatch()
    watch.start()
    try:
        run = deploy("--diff", "-vvv", env=env)
    finally:
        watch.stop.set()
        watch.join()
    try:
        assert run.returncode == 0, run.stderr[-4000:]
        assert watch.rounds > 5
        out = run.stdout + run.stderr
        assert "hf-token" in out and "Checkpoint" in out  # the download ran in this deploy
        assert API_KEY not in out and TOKEN not in out
        assert watch.hits == [], watch.hits
        journal = sandbox_sh(
            f"journalctl --sync; journalctl --no-pager -o verbose --after-cursor={shlex.quote(cursor)}"
        ).stdout
        assert "glm-flash-model-download" in journal
        assert API_KEY not in journal and TOKEN not in journal
        # The deploy went through the sudo user (inventory/sandbox.py: ssh_user glm, _sudo), as on
        # a stock Debian 13 box: sudo logged its commands to the journal checked above.
        assert "SYSLOG_IDENTIFIER=sudo" in journal and re.search(r"MESSAGE=\s*glm : .*USER=root ; COMMAND=", journal)
        logs = subprocess.run(
            ["grep", "-rlaF", "-e", API_KEY, "-e", TOKEN, str(ROOTFS / "var/log"), str(ROOTFS / "var/lib/sudo")],
            capture_output=True,
            text=True,
        )
        assert logs.stdout == ""  # sudo's own logs and timestamps, whoever may read them
        hits = [h for h in world_readable_hits(ROOTFS, since) if not h.endswith("/root/canaries")]
        assert hits == []
        # the secrets where they belong: the API key root-only, the token nowhere
        key = ROOTFS / "etc/glm-flash/api-key"
        assert key.read_text() == API_KEY and stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_uid == 0
        secrets = ROOTFS / layout.SECRETS_DIR.lstrip("/")
        assert stat.S_IMODE(secrets.stat().st_mode) == 0o700 and list(secrets.iterdir()) == []
        assert [h for h in holding(ROOTFS, since, TOKEN) if not h.endswith("/root/canaries")] == []
    finally:
        sandbox_sh("rm -f /root/canaries")
        # back to the inventory's own state (no API key) for the tests after this one
        restore = deploy()
        assert restore.returncode == 0, restore.stderr[-4000:]


def unit_state(unit: str) -> dict[str, str]:
    out = sandbox_sh(f"systemctl show -p ActiveState -p SubState -p Result -p NRestarts {unit}").stdout
    return dict(line.partition("=")[::2] for line in out.splitlines())


def until(unit: str, done, seconds: float = 60) -> dict[str, str]:
    deadline = time.monotonic() + seconds
    while not done(state := unit_state(unit)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return state


def test_the_download_unit_is_restarted_by_systemd_and_its_token_reaches_each_start_only(sandbox, profile):
    """The download's unit file exactly as the deploy writes it (checkpoint.download_unit_text: the
    template, the fetch sandbox, the restart backoff), running a stand-in for the downloader that
    fails (exit 5, as the tool does when the network fails) on its first start and runs on the
    second. systemd restarts it after RestartSec=; the token reaches each start as a credential
    that neither the service user nor the process's command line or environment shows; root's
    file of it is 0600 in a 0700 directory while the unit exists, and the credential is gone once
    the unit is down. An exit 3 (the hub refused) is not restarted."""
    unit, dest = "glm-flash-restart-test", "/srv/restart-test"
    token_file = f"{layout.SECRETS_DIR}/hf-token-{unit}"
    stand_in = (
        f"test -e {dest}/once || {{ : > {dest}/once; echo first start fails; exit 5; }}; "
        'test -s "$CREDENTIALS_DIRECTORY/hf-token" && echo second start has its token && exec sleep 300'
    )
    user = model.fetch_user(profile)

    def installed(script: str) -> None:
        text = checkpoint.download_unit_text(
            user, ["/bin/sh", "-c", script], dest, "http://127.0.0.1:9", token_file, "a stand-in"
        )
        sandbox_sh(
            f"install -d -m 700 {layout.SECRETS_DIR} && (umask 077 && printf %s {shlex.quote(KILL_TOKEN)} > {token_file})"
            f" && rm -rf {dest} && install -d -o {user} -g {user} {dest}"
            f" && printf %s {shlex.quote(text)} > {checkpoint.download_unit_path(unit)} && systemctl daemon-reload"
        )

    try:
        installed(stand_in)
        sandbox_sh(f"systemctl start {unit}")
        state = until(unit, lambda s: s.get("NRestarts") == "1" and s.get("SubState") == "running")
        assert state["NRestarts"] == "1" and state["SubState"] == "running", state
        said = sandbox_sh(f"journalctl --sync; journalctl -u {unit} -o cat --no-pager").stdout
        assert "first start fails" in said and "second start has its token" in said, said
        assert "Scheduled restart job, restart counter is at 1" in said, said
        creds = f"/run/credentials/{unit}.service"
        assert sandbox_sh(f"cat {creds}/hf-token").stdout == KILL_TOKEN
        assert sandbox_sh(
            f"runuser -u {shlex.quote(profile.service_user)} -- cat {creds}/hf-token", check=False
        ).returncode
        pid = sandbox_sh(f"systemctl show -p MainPID --value {unit}").stdout.strip()
        assert KILL_TOKEN not in sandbox_sh(f"cat /proc/{pid}/environ /proc/{pid}/cmdline | tr '\\0' ' '").stdout
        assert sandbox_sh(f"stat -c '%a %U' {token_file} {layout.SECRETS_DIR}").stdout.split() == [
            "600",
            "root",
            "700",
            "root",
        ]
        sandbox_sh(f"systemctl stop {unit}")
        assert sandbox_sh(f"test -e {creds}/hf-token", check=False).returncode != 0
        # exit 3: the hub refused; a restart cannot help, so there is none
        installed("echo the hub refused; exit 3")
        sandbox_sh(f"systemctl reset-failed {unit} 2>/dev/null; systemctl start {unit}")
        state = until(unit, lambda s: s.get("ActiveState") == "failed", 30)
        assert state["ActiveState"] == "failed" and state["NRestarts"] == "0" and state["Result"] == "exit-code", state
    finally:
        sandbox_sh(
            f"systemctl stop {unit}; systemctl reset-failed {unit}; rm -rf {checkpoint.download_unit_path(unit)} "
            f"{token_file} {dest}; systemctl daemon-reload; true"
        )
    assert sandbox_sh(f"grep -rlaF {shlex.quote(KILL_TOKEN)} /run /etc /var /tmp", check=False).stdout == ""


def verified(out: str, info: dict) -> bool:
    """The deploy's output shows the downloader's own last word and the unit's success, which
    `glm-flash-job follow` printed as it followed the download unit."""
    said = re.search(rf"glm-flash-model-fetch: verified \d+ files of {re.escape(info['repo'])}@{info['commit']}", out)
    return bool(said) and "glm-flash-job: glm-flash-model-download.service succeeded" in out


def test_a_hub_outage_during_the_deploys_download_is_outlasted_by_systemds_restart(sandbox, profile):
    """The deploy's own download meets a hub that drops a shard's connection six times in a row
    (huggingface-hub's five quick retries and the first try): the tool exits 5, systemd starts the
    unit again after its RestartSec=, the second start fetches the shard, and the deploy, which
    waited through it printing the unit's lines and systemd's, succeeds. Simulated: the hub. Then
    the unit file and the token are gone, and a deploy changes nothing."""
    info = json.loads((REPO / ".sandbox" / "hub" / "hub.json").read_text())
    files = read_dir(REPO / ".sandbox" / "hub" / "repo")
    shard = sorted(n for n in files if n.endswith(".safetensors"))[0]
    q = shlex.quote(profile.model_path)
    sandbox_sh(f"rm -f {q}/{shlex.quote(shard)}")
    with FakeHub(info["repo"], files, commit=info["commit"], drop_file=shard, drops=[0] * 6) as flaky:
        run = deploy("--data", f"hf_endpoint={flaky.endpoint}")
        left = list(flaky.drops)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert left == [], "the hub never failed: the test proves nothing"
    assert "glm-flash-model-fetch: download failed: " in out, out[-4000:]
    assert "Scheduled restart job, restart counter is at 1" in out, out[-4000:]
    assert verified(out, info), out[-4000:]
    unit_file = ROOTFS / "etc/systemd/system/glm-flash-model-download.service"
    assert not unit_file.exists() and not list((ROOTFS / layout.SECRETS_DIR.lstrip("/")).iterdir())
    again = deploy("--json")
    assert again.returncode == 0, again.stderr[-4000:]
    assert changed_operations(again.stdout) == []


PROGRESS = re.compile(
    r"glm-flash-model-fetch: [\d.]+ (B|KiB|MiB|GiB) of [\d.]+ (B|KiB|MiB|GiB) \(\d+\.\d%\), .*/s, ETA "
)


def test_the_deploy_prints_the_download_progress(sandbox, profile):
    """#21.4: the deploy's own output shows the download's progress lines (bytes of the total,
    rate, time left). Simulated: a slower hub. The sandbox hub's files, same commit, served from
    a stand-in hub in this test whose downloads share 2 bytes/s, so the two 16-byte shards take
    about 16 s; a progress line every second (download_progress_s). Then a deploy with the
    inventory's own settings changes nothing: the checkpoint is the same commit, complete."""
    info = json.loads((REPO / ".sandbox" / "hub" / "hub.json").read_text())
    files = read_dir(REPO / ".sandbox" / "hub" / "repo")
    q = shlex.quote(profile.model_path)
    shards = [n for n in files if n.endswith(".safetensors")]
    assert shards and sum(len(files[n]) for n in shards) < 100, "the stand-in's shards are tiny: the rate assumes so"
    sandbox_sh("rm -f " + " ".join(f"{q}/{shlex.quote(n)}" for n in shards))
    with FakeHub(info["repo"], files, commit=info["commit"], rate=2.0) as slow:
        run = deploy("--data", f"hf_endpoint={slow.endpoint}", "--data", "download_progress_s=1")
        served = sorted(p for m, p, _ in slow.requests if m == "GET" and "/resolve/" in p)
    assert run.returncode == 0, run.stderr[-4000:]
    assert [p.rsplit("/", 1)[1] for p in served] == sorted(shards)  # only what was missing
    out = run.stdout + run.stderr
    # the deploy reached the wait (a few seconds after the start) while the shards trickled in
    assert "glm-flash-job: following glm-flash-model-download.service" in out, out[-4000:]
    lines = [line for line in out.splitlines() if PROGRESS.search(line)]
    assert lines, out[-4000:]
    assert re.search(r"glm-flash-model-fetch: fetched 32 B in 0 min \d\d s", out), out[-4000:]
    assert verified(out, info), out[-4000:]
    again = deploy("--json")
    assert again.returncode == 0, again.stderr[-4000:]
    assert changed_operations(again.stdout) == []
