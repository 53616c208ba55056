"""pyinfra_ext/memo.py on the real sandbox: facts read together in one command are the values
pyinfra reads one by one, before a change and after it (in windows), a value is read again once
an operation has changed the host, and a second run brings what the first read without declaring it.

A small deploy file of its own runs through the real pyinfra CLI against the sandbox; its checks
run at execution time (python.call) and write what they saw to a JSON file here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyinfra_ext import memo
from tests.conftest import REPO, SANDBOX_INVENTORY, sandbox_sh

pytestmark = pytest.mark.sandbox

DEPLOY = '''
import json, os
from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory, File, FileContents, Link, Sha1File
from pyinfra.facts.server import Command, Groups
from pyinfra.operations import python, server
from pyinfra_ext import memo
from roles.facts.accounts import Account

OUT = os.environ["MEMO_OUT"]
T = "/tmp/glm-flash-memo-test"
FACTS = [
    (File, dict(path="/etc/hostname")), (File, dict(path="/etc")), (File, dict(path=T + "/absent")),
    (Directory, dict(path="/etc")), (Directory, dict(path="/etc/hostname")), (Directory, dict(path=T + "/absent")),
    (Link, dict(path="/bin")), (Link, dict(path="/etc/hostname")),
    (Sha1File, dict(path="/etc/hostname")), (Sha1File, dict(path=T + "/absent")),
    (Sha1File, dict(path="/etc/it's here")),
    (Groups, {}), (DebPackages, {}), (Account, dict(user="root")), (Account, dict(user="no-such-user")),
    # outputs of every shape: no final newline, blank lines at the end, nothing, a blank inside
    (FileContents, dict(path=T + "/no-newline")), (FileContents, dict(path=T + "/blank-end")),
    (FileContents, dict(path=T + "/empty")), (Command, dict(command="printf 'x\\n  \\n\\ny\\n'")),
]
if os.environ["MEMO_WANT"] == "1":
    for cls, kw in FACTS:
        memo.want(host, cls, **kw)
    memo.want(host, File, path=T + "/made")
seen = {}

def pairs(into):
    for cls, kw in FACTS:
        together, alone = memo.fact(host, cls, **kw), host.get_fact(cls, **kw)
        if isinstance(together, dict):
            together, alone = ({k: v for k, v in d.items() if k != "atime"} for d in (together, alone))
        seen.setdefault(into, []).append([cls.__name__, repr(kw), repr(together), repr(alone)])

def same():
    memo.fact(host, File, path=T + "/made")
    seen["batched"] = sorted(repr(k[1:]) for k in memo._run(host.state).values)
    pairs("pairs")
    seen["before"] = memo.fact(host, File, path=T + "/made")

def after():
    seen["after"] = memo.fact(host, File, path=T + "/made") is not None
    seen["again"] = memo.fact(host, File, path=T + "/made") is not None
    # After the change: the first stale read brings a window of the wanted facts after it
    now = memo.changes(host.state, host)
    cls, kw = FACTS[0]
    memo.fact(host, cls, **kw)
    seen["window"] = sum(1 for at, _ in memo._run(host.state).values.values() if at == now)
    pairs("after_pairs")
    with open(OUT, "w") as f:
        json.dump(seen, f)

python.call(name="Read together and alone", function=same)
server.shell(name="Change the host", commands=[f"touch {T}/made"])
python.call(name="Read after the change", function=after)
'''


def run(tmp_path, want: bool) -> dict:
    deploy, out = tmp_path / "memo_deploy.py", tmp_path / "seen.json"
    deploy.write_text(DEPLOY)
    # Before the run, not as an operation: the reads must come before the run's first change.
    sandbox_sh(
        "rm -rf /tmp/glm-flash-memo-test && mkdir -p /tmp/glm-flash-memo-test && cd /tmp/glm-flash-memo-test && "
        "printf 'a\\nb' > no-newline && printf 'a\\n\\n\\n' > blank-end && : > empty"
    )
    env = dict(os.environ, MEMO_OUT=str(out), MEMO_WANT=str(int(want)), GLM_FLASH_CACHE=str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", SANDBOX_INVENTORY, str(deploy)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(env, PYTHONPATH=str(REPO)),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(out.read_text())


def test_facts_read_together_equal_pyinfra_and_are_read_again_after_a_change(sandbox, tmp_path):
    seen = run(tmp_path, want=True)
    for name, kw, together, alone in seen["pairs"]:
        assert together == alone, (name, kw)
    values = {(name, kw): together for name, kw, together, _ in seen["pairs"]}
    # The reads were of real things: present, absent and of the wrong type all occur.
    assert values[("File", repr({"path": "/etc"}))] == "False"
    assert values[("File", repr({"path": "/tmp/glm-flash-memo-test/absent"}))] == "None"
    assert "'root'" in values[("Groups", "{}")] and "'systemd'" in values[("DebPackages", "{}")]
    assert values[("Account", repr({"user": "no-such-user"}))] == "None"
    assert values[("FileContents", repr({"path": "/tmp/glm-flash-memo-test/no-newline"}))] == repr(["a", "b"])
    # The first read brought every wanted fact at once (none was read alone before the others).
    assert len(seen["batched"]) == len(seen["pairs"]) + 1, seen["batched"]
    assert seen["before"] is None
    assert seen["after"] is True and seen["again"] is True
    # After the change, read again in windows (the made file's read alone, then at least
    # FIRST_WINDOW together), and still pyinfra's own values.
    assert seen["window"] >= 1 + memo.FIRST_WINDOW, seen["window"]
    assert len(seen["after_pairs"]) == len(seen["pairs"])
    for name, kw, together, alone in seen["after_pairs"]:
        assert together == alone, (name, kw)
    # What the run read is kept for the next (classes and arguments, never values), but not a
    # class that runs a command it is given (pyinfra's Command: memo.PYINFRA_FACTS).
    kept = json.loads((tmp_path / "cache" / "facts" / "sandbox.json").read_text())
    assert {"fact": "pyinfra.facts.files.Sha1File", "args": {"path": "/etc/hostname"}} in kept
    assert all(set(e) == {"fact", "args"} for e in kept)
    assert not any(e["fact"] == "pyinfra.facts.server.Command" for e in kept)
    # A second run that declares nothing still reads them all at its first read (Command alone).
    again = run(tmp_path, want=False)
    assert len(again["batched"]) == len(seen["batched"]) - 1, again["batched"]
    for name, kw, together, alone in again["pairs"]:
        assert together == alone, (name, kw)


PLAN_TIME = """
from pyinfra import host
from pyinfra.facts.files import File
from pyinfra_ext import memo

# Read at plan time, so a --dry run reads it too: two wanted facts, so the first read brings
# every wanted one (the cache's included) in one command.
memo.want(host, File, path="/etc/hostname")
memo.want(host, File, path="/etc")
memo.fact(host, File, path="/etc/hostname")
"""


def test_a_planted_cache_runs_no_command_in_a_deploy_or_a_dry_run(sandbox, tmp_path):
    """Someone who can write the facts cache plants pyinfra's Command with a canary: a plan-time
    read (--dry), and the real deploy.py run --dry and for real, leave no canary on the sandbox,
    and say they ignored the entry. (Before pyinfra_ext/memo.py's allowlist, the first run made
    the canary.)

    The runs' cache is the developer's (wheels, the packed CPython: a converged run fetches
    nothing) seen through links, with a facts directory of its own holding the planted file."""
    canary = f"/root/glm-flash-canary-{os.getpid()}"
    planted_entries = json.dumps([{"fact": "pyinfra.facts.server.Command", "args": {"command": f"touch {canary}"}}])
    real = Path(os.environ.get("GLM_FLASH_CACHE") or Path.home() / ".cache" / "glm-flash")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    for entry in real.iterdir() if real.is_dir() else []:
        if entry.name != "facts":
            (cache / entry.name).symlink_to(entry)
    (cache / "facts").mkdir(mode=0o700)
    planted = cache / "facts" / "sandbox.json"
    plan_time = tmp_path / "plan_time.py"
    plan_time.write_text(PLAN_TIME)
    sandbox_sh(f"rm -f {canary}")
    env = dict(os.environ, GLM_FLASH_CACHE=str(cache), PYTHONPATH=str(REPO))
    for extra, deploy in ((["--dry"], str(plan_time)), (["--dry"], "deploy.py"), ([], "deploy.py")):
        planted.write_text(planted_entries)  # a real run writes the file again at its end
        planted.chmod(0o600)
        r = subprocess.run(
            [sys.executable, "-m", "pyinfra", "-y", *extra, SANDBOX_INVENTORY, deploy],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1800,
            env=env,
        )
        out = r.stdout + r.stderr
        assert r.returncode == 0, out[-4000:]
        assert "ignored pyinfra.facts.server.Command" in out, (deploy, extra, out[-4000:])
        assert sandbox_sh(f"test -e {canary}", check=False).returncode != 0, f"the canary ran ({deploy} {extra})"
