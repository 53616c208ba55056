"""The facts cache (pyinfra_ext/memo.py) names commands that run as root on the host: what it may
name, and which files of it are read at all.

A planted `facts/<host>.json` in the real cache layout (GLM_FLASH_CACHE) is learned by memo._learn
for a stand-in host; what the run would read together is memo's own `wanted` table. The sandbox
proof (a canary command that must not run, in a deploy and a --dry run) is
tests/sandbox/test_fact_memo.py.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest

from pyinfra_ext import memo
from tests.conftest import REPO

CANARY = {"fact": "pyinfra.facts.server.Command", "args": {"command": "touch /canary"}}
GOOD = {"fact": "pyinfra.facts.files.File", "args": {"path": "/etc/hostname"}}
OURS = {"fact": "roles.facts.accounts.Account", "args": {"user": "root"}}
TOOL = {"fact": "roles.facts.engine.EngineEnvs", "args": {"tool": "/opt/glm-flash/bin/glm-flash-engine"}}


class State:  # weak-referenceable, with no operation run yet (memo counts changes from state.ops)
    ops: dict = {}


def host(data=None):
    return SimpleNamespace(name="node1", state=State(), data=data or {})


def plant(tmp_path, monkeypatch, entries, mode=0o600, dir_mode=0o700) -> Path:
    monkeypatch.setenv("GLM_FLASH_CACHE", str(tmp_path))
    d = tmp_path / "facts"
    d.mkdir(exist_ok=True)
    path = d / "node1.json"
    path.write_text(json.dumps(entries))
    os.chmod(path, mode)
    os.chmod(d, dir_mode)
    return path


def learned(h) -> list[str]:
    run = memo._run(h.state)
    memo._learn(run, h)
    return sorted(f"{cls.__module__}.{cls.__qualname__}" for cls, _ in run.wanted.get(h.name, {}).values())


def test_a_cache_naming_command_runs_nothing_and_says_so(tmp_path, monkeypatch, caplog):
    plant(tmp_path, monkeypatch, [CANARY, GOOD, OURS, TOOL])
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        got = learned(host())
    assert got == sorted([GOOD["fact"], OURS["fact"], TOOL["fact"]])
    assert "pyinfra.facts.server.Command" in caplog.text and "ignored" in caplog.text


@pytest.mark.parametrize(
    "args",
    [
        {"tool": "/tmp/evil"},
        {"tool": "/usr/bin/touch"},
        {"tool": "/opt/glm-flash/../../tmp/bin/glm-flash-x"},
        {"tool": "/var/lib/glm-flash/bin/glm-flash-engine"},  # the service user's home, not install_root
        {"tool": ["/opt/glm-flash/bin/glm-flash-engine"]},
        {"tool": "/opt/glm-flash/bin/glm-flashx"},
        {"tool": "/opt/glm-flash/bin/glm-flash-"},
    ],
)
def test_a_program_outside_the_install_root_is_not_run(tmp_path, monkeypatch, caplog, args):
    plant(tmp_path, monkeypatch, [{"fact": "roles.facts.engine.EngineEnvs", "args": args}, GOOD])
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert learned(host()) == [GOOD["fact"]]
    assert "roles.facts.engine.EngineEnvs" in caplog.text


def test_the_summarys_status_is_read_with_the_rest(tmp_path, monkeypatch, caplog):
    """HostStatus runs glm-flash itself (`status --json --quick`): a converged run read it alone,
    one more round trip, and warned on every run that the cache named a program outside its tools."""
    status = {"fact": "roles.facts.status.HostStatus", "args": {"tool": "/opt/glm-flash/bin/glm-flash"}}
    plant(tmp_path, monkeypatch, [status, GOOD])
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert learned(host()) == sorted([GOOD["fact"], status["fact"]])
    assert "ignored" not in caplog.text


def test_a_pyinfra_fact_only_with_the_arguments_it_quotes(tmp_path, monkeypatch, caplog):
    """SystemdEnabled puts `machine` into its command unquoted: only `services` is taken."""
    name = "pyinfra.facts.systemd.SystemdEnabled"
    plant(tmp_path, monkeypatch, [{"fact": name, "args": {"services": ["glm-flash.service"]}}])
    assert learned(host()) == [name]
    plant(tmp_path, monkeypatch, [{"fact": name, "args": {"machine": "x; touch /canary"}}, GOOD])
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert learned(host()) == [GOOD["fact"]]
    assert name in caplog.text


def test_the_checks_own_record_dir_and_interpreter(tmp_path, monkeypatch):
    flag = "roles.facts.engine.LaunchFlagCheck"
    args = {"python": "/srv/g/engine/envs/a/bin/python", "tool": "/srv/g/bin/glm-flash-check-flags", "spec_json": "{}"}
    plant(tmp_path, monkeypatch, [{"fact": flag, "args": args}])
    assert learned(host({"install_root": "/srv/g"})) == [flag]
    plant(tmp_path, monkeypatch, [{"fact": flag, "args": {**args, "record_dir": "/etc/cron.d"}}])
    assert learned(host({"install_root": "/srv/g"})) == []
    plant(tmp_path, monkeypatch, [{"fact": flag, "args": {**args, "python": "/bin/sh"}}])
    assert learned(host({"install_root": "/srv/g"})) == []


@pytest.mark.parametrize(
    "mode, dir_mode, owner, words",
    [
        (0o620, 0o700, None, "group or others may write it"),
        (0o602, 0o700, None, "group or others may write it"),
        (0o600, 0o770, None, "its directory"),
        (0o600, 0o707, None, "its directory"),
        (0o600, 0o700, 65534, "belongs to uid 65534"),
    ],
)
def test_a_cache_someone_else_could_write_is_ignored(tmp_path, monkeypatch, caplog, mode, dir_mode, owner, words):
    path = plant(tmp_path, monkeypatch, [GOOD, OURS], mode, dir_mode)
    if owner is not None:
        if os.geteuid() != 0:
            pytest.skip("chown needs root")
        os.chown(path, owner, owner)
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert learned(host()) == []
    assert words in caplog.text and str(path) in caplog.text


def test_a_linked_cache_file_is_ignored(tmp_path, monkeypatch, caplog):
    real = plant(tmp_path, monkeypatch, [GOOD])
    link = real.with_name("other.json")
    real.rename(link)
    real.symlink_to(link)
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert learned(host()) == []
    assert "ignored" in caplog.text


def test_the_control_a_private_cache_is_learned(tmp_path, monkeypatch, caplog):
    plant(tmp_path, monkeypatch, [GOOD, OURS])
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        assert learned(host()) == sorted([GOOD["fact"], OURS["fact"]])
    assert caplog.text == ""


def test_saved_private_and_only_allowed_classes(tmp_path, monkeypatch):
    from pyinfra.facts.files import File
    from pyinfra.facts.server import Command

    monkeypatch.setenv("GLM_FLASH_CACHE", str(tmp_path / "c"))
    run = memo._Run()
    run.read["node1"] = {1: (File, {"path": "/x"}), 2: (Command, {"command": "id"})}
    memo._save(weakref.ref(run))
    path = tmp_path / "c" / "facts" / "node1.json"
    assert json.loads(path.read_text()) == [{"fact": "pyinfra.facts.files.File", "args": {"path": "/x"}}]
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700


def _memoised_pyinfra_facts() -> set[str]:
    """pyinfra fact classes the repo passes to memo.fact() or memo.want(), read from the source."""
    found = set()
    for path in [*REPO.glob("roles/**/*.py"), REPO / "deploy.py", REPO / "deploy_fleet.py"]:
        tree = ast.parse(path.read_text())
        imported = {
            alias.asname or alias.name: f"{node.module}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pyinfra.facts.")
            for alias in node.names
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("fact", "want")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "memo"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Name)
                and node.args[1].id in imported
            ):
                found.add(imported[node.args[1].id])
    return found


def test_the_allowlist_is_what_the_deploy_memoises():
    assert _memoised_pyinfra_facts() == set(memo.PYINFRA_FACTS)


def test_a_base_class_without_a_command_is_left_out_of_the_batch():
    """A cache may name a class of ours that has no command (ParsedFact): the batch goes on
    without it instead of ending the run."""
    from pyinfra.facts.files import File

    from roles.facts import ParsedFact

    ran = []
    out = SimpleNamespace(stdout_lines=[])
    h = pyinfra_host({})
    h.run_shell_command = lambda command, **kw: ran.append(command) or (True, out)
    facts = {("node1", ParsedFact, "{}"): (ParsedFact, {}), ("node1", File, "{}"): (File, {"path": "/x"})}
    assert memo._read_together(h, facts) == {}
    assert len(ran) == 1 and "/x" in str(ran[0])


def pyinfra_host(data: dict):
    """A host of pyinfra's own, with its state and data (no connection)."""
    from pyinfra.api import Config, Inventory, State

    inventory = Inventory(([("node1", data)], {}))
    h = inventory.get_host("node1")
    h.state = State(inventory, Config())
    return h


@pytest.mark.parametrize("data, expected", [({}, False), ({"_sudo": True}, True)])
def test_the_batched_read_runs_as_pyinfra_reads_a_fact(data, expected):
    """A host reached as a user with `_sudo` (issue 39): the memo's one command for many facts
    gets the host's `_sudo` as pyinfra's own fact read does, so facts are root's view."""
    from pyinfra.facts.files import File

    h = pyinfra_host(data)
    seen = {}

    def run_shell_command(command, **kw):
        seen.update(kw)
        return True, SimpleNamespace(stdout_lines=[])

    h.run_shell_command = run_shell_command
    memo._read_together(h, {("node1", File, "{}"): (File, {"path": "/x"})})
    assert seen.get("_sudo", False) is expected
