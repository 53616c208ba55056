"""The service restart decided from the host's state (roles/operations/service_restart.py),
its fact's parser on real `systemctl show` / `find -printf` output, and the unit's log filter."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from pyinfra.api import FunctionCommand

from roles.facts.service import ServiceStart, ServiceStartState, SystemdVersion
from roles.operations.service_restart import started_from_disk
from roles.service import KEY_LOG_PATTERN
from tests.unit.fakehost import FakeHost, on, render

INPUTS = ["/etc/systemd/system/glm-flash.service", "/etc/glm-flash/launch.json", "/opt/glm-flash/engine/current"]
T0 = 1_764_570_000.0  # the last start


def run(state: ServiceStart, can_serve: bool = True) -> tuple[list[str], list[str]]:
    fake = FakeHost({ServiceStartState: state})
    with on(fake):
        cmds = [
            shown(c) for c in started_from_disk._inner(service="glm-flash.service", inputs=INPUTS, can_serve=can_serve)
        ]
    return cmds, fake.noops


def shown(command) -> str:
    """A command as text; one whose output streams to the deploy (job.followed) as what it runs."""
    if isinstance(command, FunctionCommand) and command.function.__name__ == "_follow":
        return "streamed: " + render(command.args[1])
    return render(command)


RESTART = (
    "streamed: journalctl --no-pager -f -n 0 -o cat -u glm-flash.service & j=$!; "
    "systemctl restart glm-flash.service ; rc=$?; sleep 1; kill $j; exit $rc"
)


def state(active="active", reload=False, last_start=T0, newest=T0 - 60) -> ServiceStart:
    return ServiceStart(active, reload, last_start, {p: newest - i for i, p in enumerate(INPUTS)})


def test_parses_systemctl_show_and_find_output():
    lines = [
        "NeedDaemonReload=no",
        "NeedDaemonReload=yes",
        "ActiveState=failed",
        "InactiveExitTimestamp=Tue 2026-12-01 06:12:32.123456 UTC",
        "mtime=1764569551.2500000000 /etc/glm-flash/launch.json",
        "mtime=1764569000.0000000000 /opt/glm-flash/engine/current",
    ]
    s = ServiceStartState.parse(lines)
    assert s.active_state == "failed" and s.need_daemon_reload
    assert s.last_start == datetime(2026, 12, 1, 6, 12, 32, 123456, tzinfo=UTC).timestamp()
    assert s.newest_input == (1764569551.25, "/etc/glm-flash/launch.json")
    never = ServiceStartState.parse(["NeedDaemonReload=no", "ActiveState=inactive", "InactiveExitTimestamp="])
    assert never.last_start == 0 and never.inputs == {} and not never.need_daemon_reload


def test_systemd_version():
    assert SystemdVersion.parse(["systemd 257 (257.13-1~deb13u1)", "+PAM +AUDIT"]) == 257
    assert SystemdVersion.parse([]) == 0


def test_running_from_what_is_on_disk_is_left_alone():
    cmds, noops = run(state())
    assert cmds == [] and noops == ["glm-flash.service started from what is on disk (active)"]


def test_a_file_changed_after_the_start_restarts_it():
    """A run killed after the upload and before the restart: only the mtimes tell."""
    cmds, _ = run(state(newest=T0 + 5))
    assert cmds == [
        "systemctl reset-failed glm-flash.service 2>/dev/null || true",
        RESTART,
    ]


def test_an_unloaded_unit_change_reloads_first():
    cmds, _ = run(state(reload=True))
    assert cmds[0] == "systemctl daemon-reload" and cmds[-1] == RESTART


def test_gpu_host_starts_a_stopped_service_even_when_nothing_changed():
    cmds, _ = run(state(active="failed"))
    assert cmds[-1] == RESTART
    cmds, _ = run(state(active="activating"))
    assert cmds == []


def test_host_without_gpu_tries_once_per_change_without_waiting():
    cmds, noops = run(state(active="failed"), can_serve=False)
    assert cmds == [] and noops
    cmds, _ = run(state(active="failed", newest=T0 + 1), can_serve=False)
    tried = ["systemctl restart glm-flash.service || true", "systemctl stop glm-flash.service"]
    assert cmds[-2:] == tried
    cmds, _ = run(state(active="inactive", last_start=0), can_serve=False)
    assert cmds[-2:] == tried


def test_bad_arguments_are_refused():
    from pyinfra.api import OperationError

    with pytest.raises(OperationError):
        run_bad = started_from_disk._inner(service="glm-flash", inputs=INPUTS)
        with on(FakeHost({})):
            list(run_bad)


@pytest.mark.parametrize(
    "line",
    [
        "server_args=ServerArgs(model_path='/srv/m', api_key='sk-123', admin_api_key=None)",
        "{'api_key': 'sk-123', 'model': 'm'}",
        '"api-key": "sk-123"',
        "--api-key sk-123",  # not a value form we know of: kept (below)
        "Authorization: Bearer sk-123",
    ],
)
def test_log_filter_drops_key_values(line):
    dropped = re.search(KEY_LOG_PATTERN, line) is not None
    assert dropped == (not line.startswith("--api-key"))


@pytest.mark.parametrize(
    "line",
    [
        "server_args=ServerArgs(model_path='/srv/m', served_model_name='glm')",
        "server_args=ServerArgs(api_key=None, admin_api_key=None)",
        "non-default args: {'api_key': '***', 'model': 'm'}",
        "Uvicorn running on http://127.0.0.1:30000",
    ],
)
def test_log_filter_keeps_lines_without_a_key(line):
    assert re.search(KEY_LOG_PATTERN, line) is None


class FakeRoll:
    """What roles/fleet/roll.py's Roll hands the operation (its pyinfra glue, without a gateway)."""

    def __init__(self, missing: bool = False):
        self.missing, self.commands = missing, []

    def command(self, restart_cmd, serving: bool):
        self.commands.append((render(restart_cmd), serving))
        return "ROLL"

    def put_back(self):
        return "PUT BACK" if self.missing else None


def rolled(s: ServiceStart, roll: FakeRoll, can_serve: bool = True) -> list:
    with on(FakeHost({ServiceStartState: s})):
        return list(
            started_from_disk._inner(service="glm-flash.service", inputs=INPUTS, can_serve=can_serve, roll=roll)
        )


def test_behind_a_gateway_a_serving_engines_restart_is_the_rolls_command():
    roll = FakeRoll()
    cmds = rolled(state(newest=T0 + 5), roll)
    assert cmds[-1] == "ROLL" and not any("streamed" in str(c) for c in cmds)
    assert roll.commands == [(RESTART.removeprefix("streamed: "), True)]
    # Not serving (first start, failed): the roll starts it without taking it out (serving=False).
    roll = FakeRoll()
    assert rolled(state(active="failed"), roll)[-1] == "ROLL" and roll.commands[0][1] is False


def test_behind_a_gateway_a_converged_worker_left_out_by_a_stopped_roll_is_put_back():
    assert rolled(state(), FakeRoll(missing=True)) == ["PUT BACK"]
    assert rolled(state(), FakeRoll()) == []  # listed: nothing to do, no change reported
    # No GPU (the engine cannot serve): the roll is not asked.
    assert rolled(state(), FakeRoll(missing=True), can_serve=False) == []
