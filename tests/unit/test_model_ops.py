"""The model role's operations and the secret operation, on fake facts (tests/unit/fakehost.py):
each does nothing when the host's state already holds and says exactly what it would run
otherwise. What the commands do on a real system: tests/sandbox/test_model_download.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from fakehost import F, FakeHost, commands, on, render
from pyinfra.api import FunctionCommand, OperationError
from pyinfra.facts.files import Directory, File

from control import model_lock
from roles.facts.accounts import Account, AccountInfo
from roles.facts.model import DownloaderMarker, ModelCheck, UnitActive
from roles.facts.system import HostPython
from roles.operations import checkpoint, secrets
from sandbox.fake_hub import FakeHub
from tests.unit.test_render import directives

FETCH_ACCOUNT = AccountInfo("/nonexistent", "/usr/sbin/nologin", "glm-flash-fetch", frozenset())

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-unit-" + "Wq3" * 8
COMMIT = "0123456789abcdef" * 2 + "01234567"


def secret_facts(dest="/etc/glm-flash/api-key", content=None, mode=600, user="root", dir_mode=750):
    have = {"user": user, "group": "root", "mode": mode} if content is not None else None
    return {
        F(Directory, path="/etc/glm-flash"): {"user": "root", "group": "glm-flash", "mode": dir_mode},
        F(Directory, path="/etc/glm-flash/secrets"): {"user": "root", "group": "root", "mode": 700},
        F(File, path=dest): have,
    }


def put(facts, **kw):
    args = dict(dest="/etc/glm-flash/api-key", secret=secrets.Secret(KEY), stage_dir="/etc/glm-flash/secrets")
    return commands(secrets.secret_file, facts, **{**args, **kw})


def on_host(monkeypatch, content):
    """The host's comparison (secrets.holds, a cmp there) as a file holding `content` answers it."""
    monkeypatch.setattr(
        secrets, "holds", lambda dest, secret: content is not None and secret.reveal() == content.encode()
    )


def test_secret_file_is_a_noop_when_content_owner_and_mode_hold(monkeypatch):
    on_host(monkeypatch, KEY)
    assert put(secret_facts(content=KEY)) == []


def test_secret_file_stages_root_only_then_renames_and_never_shows_the_value(monkeypatch):
    for facts, content in (
        (secret_facts(), None),
        (secret_facts(content="old"), "old"),
        (secret_facts(content=KEY, mode=644), KEY),
    ):
        on_host(monkeypatch, content)
        cmds = put(facts)
        assert cmds[0] == "install -d -m 700 -o root -g root /etc/glm-flash/secrets"
        assert cmds[2] == "function _written"  # through a root command's stdin, not an upload
        assert cmds[3:] == [
            "chown root:root /etc/glm-flash/secrets/.api-key.upload",
            "chmod 600 /etc/glm-flash/secrets/.api-key.upload",
            "sync /etc/glm-flash/secrets/.api-key.upload",
            "mv -f -T /etc/glm-flash/secrets/.api-key.upload /etc/glm-flash/api-key",
        ]
        # the value in no command
        assert [c for c in cmds if KEY in c] == []
    assert KEY not in repr(secrets.Secret(KEY)) and KEY not in str(secrets.Secret(KEY))


@pytest.mark.parametrize("secret", [KEY, "short", KEY + "\n", "two\nlines", "é-ünïcode", " x "])
def test_the_host_compares_the_secret_it_gets_on_stdin_and_nothing_of_it_is_shown(tmp_path, secret):
    """secrets.holds' real command in a real shell here: the same bytes compare equal, any other
    file (a prefix, a trailing newline more or less, none) differs; the command names no secret
    and nothing derived from it, and pyinfra is asked to print neither the command nor its output."""
    seen = []

    class Host:
        def run_shell_command(self, command, **kw):
            seen.append((command, kw))
            raw = command.get_raw_value()
            done = subprocess.run(["sh", "-c", raw], input=kw["_stdin"] + "\n", text=True, capture_output=True)
            assert done.stdout == "" and done.stderr == ""
            return done.returncode == 0, None

    dest = tmp_path / "api-key"
    hashes = {hashlib.new(a, secret.encode()).hexdigest() for a in ("sha256", "sha1", "md5", "sha512")}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(secrets, "host", Host())
        for content, same in ((secret, True), (secret + "\n", False), (secret[:-1], False), ("", False)):
            dest.write_bytes(content.encode())
            assert secrets.holds(str(dest), secrets.Secret(secret)) is same, repr(content)
        dest.unlink()
        assert secrets.holds(str(dest), secrets.Secret(secret)) is False
    for command, kw in seen:
        shown = command.get_raw_value()
        assert secret.strip() not in shown and not any(h in shown for h in hashes), shown
        assert kw["print_input"] is False and kw["print_output"] is False


def test_secret_file_refuses_a_directory_others_can_write_and_loose_modes():
    with pytest.raises(OperationError, match="no one but root may write"):
        put(secret_facts(dir_mode=775))
    with pytest.raises(OperationError, match="lets others read"):
        put(secret_facts(), mode="644")
    with pytest.raises(OperationError, match="wrapped in Secret"):
        put(secret_facts(), secret=KEY)


DGX_OS_PYTHON = {
    "implementation": "cpython",
    "version": "3.12",
    "platform": "linux-aarch64",
    "libc": "glibc 2.39",
    "bits": 64,
}


def test_downloader_installed_rebuilds_only_when_the_requirements_change():
    req = (REPO / "files/hf-hub-requirements.txt").read_text()
    venv = "/opt/glm-flash/tools/hf-hub"
    marker = F(DownloaderMarker, marker=f"{venv}/.glm-flash-requirements.sha256")
    done = {F(Account, user="glm-flash-fetch"): FETCH_ACCOUNT, marker: hashlib.sha256(req.encode()).hexdigest()}
    wheel = REPO / "files/hf-hub-requirements.txt"  # any local file stands for a wheel here
    asked = []
    args = dict(venv=venv, requirements=req, wheels_for=lambda found: asked.append(found) or [str(wheel)])
    args.update(user="glm-flash-fetch", uv="/opt/glm-flash/tools/uv")
    assert commands(checkpoint.downloader_installed, done, **args) == []
    assert asked == []  # built: no wheels chosen, the host's python3 not even read
    stale = {F(Account, user="glm-flash-fetch"): None, marker: "stale", HostPython: DGX_OS_PYTHON}
    cmds = commands(checkpoint.downloader_installed, stale, **args)
    assert asked == [DGX_OS_PYTHON]  # the wheels are chosen for what the host's python3 said
    assert cmds[0].startswith("useradd --system") and cmds[0].endswith(" glm-flash-fetch")
    assert f"upload {venv}.wheels/hf-hub-requirements.txt" in "\n".join(cmds)
    # uv makes the venv with the host's python3, then installs from the uploaded wheelhouse alone
    (made,) = [c for c in cmds if c.startswith("/opt/glm-flash/tools/uv venv ")]
    assert made.endswith(f"--python python3 {venv}") and "--no-python-downloads" in made and "--no-config" in made
    (pip,) = [c for c in cmds if c.startswith("/opt/glm-flash/tools/uv pip install ")]
    assert cmds.index(made) < cmds.index(pip)
    assert "--require-hashes" in pip and "--no-index" in pip and f"--find-links {venv}.wheels" in pip
    assert "--no-deps" in pip and "--only-binary :all:" in pip and "--no-config" in pip and "--offline" in pip
    assert f"--python {venv}/bin/python " in pip and not any("pip " in c and "/bin/pip" in c for c in cmds)
    # the marker after the work, which is flushed first; the marker and its directory fsynced
    assert cmds[-1].startswith("sync && printf") and "mv -f" in cmds[-1] and cmds[-1].endswith(f"&& sync {venv}")


def test_downloader_without_wheels_for_the_hosts_python_is_refused_before_anything_runs():
    """Planned: the operation raises (refusal.host_refusals then refuses the host before any of its
    operations runs). Running (python3 installed since the plan): it fails this host only."""
    req = (REPO / "files/hf-hub-requirements.txt").read_text()
    venv = "/opt/glm-flash/tools/hf-hub"
    facts = {
        F(Account, user="glm-flash-fetch"): None,
        F(DownloaderMarker, marker=f"{venv}/.glm-flash-requirements.sha256"): "",
        HostPython: {**DGX_OS_PYTHON, "libc": ""},
    }

    def none_for(found):
        raise OperationError(f"node1: model_download: no wheels for {found['platform']} without glibc. Fix: ...")

    args = dict(venv=venv, requirements=req, wheels_for=none_for, user="glm-flash-fetch", uv="/opt/glm-flash/tools/uv")
    with pytest.raises(OperationError, match="model_download: no wheels for linux-aarch64"):
        commands(checkpoint.downloader_installed, facts, **args)
    fake = FakeHost(facts)
    fake.state.is_executing = True
    with on(fake):
        (command,) = checkpoint.downloader_installed._inner(**args)  # nothing else: no useradd either
    assert isinstance(command, FunctionCommand) and command.function.__name__ == "_fail_this_host"
    assert "model_download: no wheels for linux-aarch64" in command.args[0]


STARTED = dict(
    repo_id="zai-org/GLM-5.3-Flash",
    commit=COMMIT,
    requested="main",
    path="/srv/models/GLM 5",
    tool="/opt/glm-flash/bin/glm-flash-model-fetch",
    hub_python="/opt/glm-flash/tools/hf-hub/bin/python",
    fetch_user="glm-flash-fetch",
    job_tool="/opt/glm-flash/bin/glm-flash-job",
)
PRESENT = {**STARTED, "wait": True}  # the same arguments: the wait starts the download again when it is not running
UNIT_FILE = "/etc/systemd/system/glm-flash-model-download.service"
TOKEN_FILE = "/etc/glm-flash/secrets/hf-token-glm-flash-model-download"


def started(facts, **kw):
    return commands(checkpoint.checkpoint_download, facts, **{**STARTED, **kw})


def present(facts, **kw):
    return commands(checkpoint.checkpoint_download, facts, **{**PRESENT, **kw})


def check_facts(exit_code=0, sealed=True, token_left=None, active="inactive", unit_file=None):
    return {
        ModelCheck: {"exit": exit_code, "state": "x", "reason": "", "sealed": sealed},
        F(File, path=TOKEN_FILE): token_left,
        F(File, path=UNIT_FILE): unit_file,
        UnitActive: active,
    }


def unit_text(cmds) -> str:
    (upload,) = [c for c in cmds if c.startswith("upload ") and "[Service]" in c]
    return upload.split("\n", 1)[1]


def test_checkpoint_present_is_a_noop_when_verified_and_sealed():
    assert present(check_facts()) == []
    assert started(check_facts()) == []


def test_checkpoint_present_seals_and_clears_without_downloading():
    for leftover in (dict(token_left={"mode": 600}), dict(unit_file={"mode": 644})):
        assert started(check_facts(sealed=False, **leftover)) == []
        cmds = present(check_facts(sealed=False, **leftover))
        assert cmds == [
            f"systemctl disable --now --quiet glm-flash-model-download.service 2>/dev/null; rm -f {UNIT_FILE} "
            f"{TOKEN_FILE}",
            "systemctl daemon-reload",
            # the downloader's units are stopped first (the tool's --owner)
            "python3 /opt/glm-flash/bin/glm-flash-model-fetch seal --dest '/srv/models/GLM 5' --owner glm-flash-fetch",
        ]


def test_download_starts_in_the_background_as_a_unit_with_systemds_restart_backoff():
    cmds = started(check_facts(exit_code=1, sealed=False), token=secrets.Secret(KEY))
    unseal = (
        "python3 /opt/glm-flash/bin/glm-flash-model-fetch unseal --dest '/srv/models/GLM 5' --owner glm-flash-fetch"
    )
    assert unseal in cmds
    text = unit_text(cmds)
    unit = directives(text)
    (start,) = unit["ExecStart"]
    assert start == (
        "/opt/glm-flash/tools/hf-hub/bin/python /opt/glm-flash/bin/glm-flash-model-fetch download "
        f'--dest "/srv/models/GLM 5" --repo zai-org/GLM-5.3-Flash --revision {COMMIT} --every 30 --requested main'
    )
    # restarted by systemd, each wait longer, bounded; not for the exits a restart cannot mend
    assert unit["Restart"] == ["on-failure"] and unit["RestartSec"] == ["10s"] and unit["RestartSteps"] == ["6"]
    assert unit["RestartMaxDelaySec"] == ["10min"] and unit["RestartPreventExitStatus"] == ["3 4"]
    assert unit["StartLimitIntervalSec"] == ["4h"] and unit["StartLimitBurst"] == ["10"]
    assert unit["WantedBy"] == ["multi-user.target"]  # a reboot resumes it
    assert unit["User"] == unit["Group"] == ["glm-flash-fetch"] and unit["Type"] == ["exec"]
    assert unit["LoadCredential"] == [f"hf-token:{TOKEN_FILE}"]
    assert 'ReadWritePaths="/srv/models/GLM 5"' in text.splitlines() and "NoNewPrivileges=yes" in text.splitlines()
    assert KEY not in text
    # written, systemd told, then enabled and started: after the tree is the downloader's
    upload = next(i for i, c in enumerate(cmds) if c.startswith("upload ") and "[Service]" in c)
    (moved,) = [i for i, c in enumerate(cmds) if c.endswith(f" {UNIT_FILE} && sync /etc/systemd/system")]
    enable = "/opt/glm-flash/bin/glm-flash-job start glm-flash-model-download.service"  # enable --now, its lines if not
    assert upload < moved < cmds.index("systemctl daemon-reload") < cmds.index(unseal) < cmds.index(enable)
    assert cmds.index(enable) == len(cmds) - 1
    # the token goes by the secret's own function (compared by hash, never shown), in no command
    assert "function _written" in cmds and not [c for c in cmds if KEY in c]
    # a running download (an earlier run's SSH dropped) is not started twice
    assert started(check_facts(exit_code=1, sealed=False, active="active"), token=secrets.Secret(KEY)) == []
    # no token: no credential
    assert "LoadCredential" not in directives(unit_text(started(check_facts(exit_code=1, sealed=False))))
    with pytest.raises(OperationError, match="not a commit"):
        started(check_facts(exit_code=1), commit="main")


def test_exec_start_words_are_quoted_for_systemd():
    word = checkpoint._exec_word
    assert word("/srv/models/GLM-5.3") == "/srv/models/GLM-5.3"
    assert word("/srv/a b") == '"/srv/a b"'
    assert word('/srv/a"b\\c') == '"/srv/a\\"b\\\\c"'
    assert word("/srv/100%$HOME") == '"/srv/100%%$$HOME"'  # no specifier, no variable


def present_cmds(facts) -> tuple[list, list[str]]:
    with on(FakeHost(facts)):
        cmds = list(checkpoint.checkpoint_download._inner(**PRESENT, token=secrets.Secret(KEY)))
    return cmds, [render(c) for c in cmds]


START = "/opt/glm-flash/bin/glm-flash-job start glm-flash-model-download.service"
CHECK = (
    f"python3 -E -s /opt/glm-flash/bin/glm-flash-model-fetch check --dest '/srv/models/GLM 5' "
    f"--repo zai-org/GLM-5.3-Flash --revision {COMMIT} --hint "
)


def test_checkpoint_present_waits_for_the_download_then_removes_its_unit_and_seals():
    cmds, rendered = present_cmds(check_facts(exit_code=1, sealed=False, active="active", unit_file={"mode": 644}))
    assert "function _written" in rendered  # the token, for a restart; removed below
    assert unit_text(rendered)  # the unit file as this run says (an older deploy's transient unit has none)
    assert START not in rendered and not [c for c in rendered if c.startswith("if ")]  # it runs: not started again
    follow = next(c for c in cmds if isinstance(c, FunctionCommand) and c.function.__name__ == "_follow")
    # followed through systemd's restarts by the job tool, then checked: its reason said when incomplete
    assert follow.args[1].get_raw_value() == "/opt/glm-flash/bin/glm-flash-job follow glm-flash-model-download.service"
    checked = rendered[cmds.index(follow) + 1]
    assert checked.startswith(CHECK) and "without a complete checkpoint" in checked, checked
    assert rendered[-3:] == [
        f"systemctl disable --now --quiet glm-flash-model-download.service 2>/dev/null; rm -f {UNIT_FILE} {TOKEN_FILE}",
        "systemctl daemon-reload",
        "python3 /opt/glm-flash/bin/glm-flash-model-fetch seal --dest '/srv/models/GLM 5' --owner glm-flash-fetch",
    ]
    assert not [c for c in rendered if KEY in c]
    with pytest.raises(OperationError, match="not a commit"):
        present(check_facts(exit_code=1), commit="main")


@pytest.mark.parametrize("active", ["inactive", "failed", "activating"])
def test_an_incomplete_download_is_started_again_only_when_its_unit_neither_runs_nor_failed(active):
    """Stopped by hand (or started by an older deploy as a transient unit, gone): started again,
    the finished files kept. Failed for good: followed to its end, which fails the run with its
    lines. Waiting for systemd's restart (activating): followed."""
    cmds, rendered = present_cmds(check_facts(exit_code=1, sealed=False, active=active))
    follow = next(c for c in cmds if isinstance(c, FunctionCommand) and c.function.__name__ == "_follow")
    if active != "inactive":
        assert START not in rendered
        return
    told = next(c for c in cmds if isinstance(c, FunctionCommand) and c.function.__name__ == "_told")
    assert "is not running and the checkpoint is incomplete: starting it again" in told.args[0]
    unseal = (
        "python3 /opt/glm-flash/bin/glm-flash-model-fetch unseal --dest '/srv/models/GLM 5' --owner glm-flash-fetch"
    )
    assert cmds.index(told) < rendered.index(unseal) < rendered.index(START) < cmds.index(follow)


def test_model_lock_resolves_main_through_the_lock_only(tmp_path):
    lock = tmp_path / "model.json"
    with pytest.raises(model_lock.ModelLockError, match="make model-lock"):
        model_lock.commit_for("zai-org/GLM-5.3-Flash", "main", lock)
    assert model_lock.commit_for("zai-org/GLM-5.3-Flash", COMMIT, lock) == COMMIT
    model_lock.record("zai-org/GLM-5.3-Flash", "main", COMMIT, lock)
    assert model_lock.commit_for("zai-org/GLM-5.3-Flash", "main", lock) == COMMIT
    with pytest.raises(model_lock.ModelLockError, match="not a commit"):
        model_lock.record("zai-org/GLM-5.3-Flash", "main", "nope", lock)


def test_make_model_lock_asks_the_hub_once(tmp_path):
    lock = tmp_path / "model.json"
    with FakeHub("zai-org/GLM-5.3-Flash", {"config.json": b"{}"}, commit=COMMIT) as hub:
        r = subprocess.run(
            [
                sys.executable,
                str(REPO / "scripts/model_lock.py"),
                "--model",
                "zai-org/GLM-5.3-Flash",
                "--lock",
                str(lock),
            ],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "HF_ENDPOINT": hub.endpoint},
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert [p for _, p, _ in hub.requests] == ["/api/models/zai-org/GLM-5.3-Flash/revision/main"]
    assert json.loads(lock.read_text()) == {"zai-org/GLM-5.3-Flash": {"main": COMMIT}}


def test_the_model_lock_is_beside_an_operators_inventory(tmp_path):
    """An inventory outside the repo's tracked inventory/ (inventory/local/, or a directory of
    the operator's own) keeps its lock beside it; the repo's own inventories use locks/model.json."""
    from control import layout

    assert model_lock.lock_path(layout.REPO / "inventory" / "l40s.py") == model_lock.LOCK
    assert model_lock.lock_path(layout.REPO / "inventory" / "local" / "l40s.py") == (
        layout.REPO / "inventory" / "local" / "model-lock.json"
    )
    mine = tmp_path / "site" / "gpu1.py"
    mine.parent.mkdir()
    assert model_lock.lock_path(mine) == tmp_path / "site" / "model-lock.json"
    model_lock.record("zai-org/GLM-5.3-Flash", "main", COMMIT, model_lock.lock_path(mine))
    assert model_lock.commit_for("zai-org/GLM-5.3-Flash", "main", tmp_path / "site" / "model-lock.json") == COMMIT


def test_a_secret_is_written_by_root_from_stdin_never_through_an_upload():
    """Through a sudo user pyinfra's upload parks a file in the SSH user's /tmp first (mode from
    its umask: readable by others) before root copies it: a secret goes on a root command's stdin
    instead, with the host's _sudo (issue 39)."""
    import base64

    from tests.unit.test_fact_memo_trust import pyinfra_host

    h = pyinfra_host({"ssh_user": "glm", "_sudo": True})
    seen = {}

    def run_shell_command(command, **kw):
        seen.update(kw, command=command.get_raw_value())
        return True, None

    h.run_shell_command = run_shell_command
    assert secrets._written(None, h, "/etc/glm-flash/secrets/.api-key.upload", secrets.Secret(KEY))
    assert seen["command"] == "umask 077 && base64 -d > /etc/glm-flash/secrets/.api-key.upload"
    assert base64.b64decode(seen["_stdin"]).decode() == KEY and seen["_sudo"] is True
    assert seen["print_input"] is False and seen["print_output"] is False


LOAD = """
import sys
from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_state
from pyinfra_cli.inventory import make_inventory
from control import model_lock
with ctx_state.use(State(Inventory(([], {})), Config())):
    make_inventory(sys.argv[1], cwd=sys.argv[2])
print(model_lock.lock_path())
"""


def test_pyinfra_loading_an_operators_inventory_puts_its_lock_beside_it(tmp_path):
    """pyinfra's own inventory loader (group_data/all.py runs check_inventory while it loads) tells
    the model lock where the inventory is: a directory of the operator's own keeps its lock there.
    In a process of its own: pyinfra's CLI package patches threading (gevent) when imported."""
    import subprocess
    import sys

    from control import layout

    site = tmp_path / "site"
    site.mkdir()
    (site / "known_hosts").write_text("gpu9.lan ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMm\n")
    data = {
        "ssh_user": "root",
        "ssh_known_hosts_file": str(site / "known_hosts"),
        "ssh_strict_host_key_checking": "yes",
    }
    (site / "gpu9.py").write_text(f"hosts = [('gpu9.lan', {data!r})]\n")
    run = subprocess.run(
        [sys.executable, "-c", LOAD, str(site / "gpu9.py"), str(layout.REPO)],
        cwd=layout.REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().splitlines()[-1] == str(site / "model-lock.json")
