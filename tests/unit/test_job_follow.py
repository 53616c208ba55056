"""`glm-flash-job follow UNIT`: a unit of its own (the checkpoint's download) followed through
systemd's restarts until it ends for good, against stand-in systemctl and journalctl (simulated:
systemd itself; tests/sandbox/test_model_download.py follows the real download unit through a
real restart, and tests/gb10/test_downloader_arm64.py on the arm64 root).

The stand-ins play a script: each `systemctl show` answers the next state of STATES (the last one
stays), and journalctl prints the journal lines written so far, after the cursor asked for."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from tests.conftest import REPO, host_tool

SYSTEMCTL = r"""#!/usr/bin/env python3
import json, os, sys
state = os.environ["STATE"]
with open(f"{state}/calls", "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
if sys.argv[1] == "enable":  # a start: its lines (stamped now), and the exit status the test chose
    import time
    with open(f"{state}/journal", "a") as j:
        for line in json.load(open(f"{state}/start_lines")) if os.path.exists(f"{state}/start_lines") else []:
            j.write(f"@{int(time.time())} {line}\n")
    sys.exit(int(open(f"{state}/enable_rc").read()) if os.path.exists(f"{state}/enable_rc") else 0)
if sys.argv[1] == "show":
    states = json.load(open(f"{state}/states"))
    n = int(open(f"{state}/n").read()) if os.path.exists(f"{state}/n") else 0
    open(f"{state}/n", "w").write(str(n + 1))
    step = states[min(n, len(states) - 1)]
    # the journal grows as the unit runs: the lines of this step become visible
    with open(f"{state}/journal", "a") as j:
        for line in step.get("lines", []):
            j.write(line + "\n")
    for k, v in step["props"].items():
        print(f"{k}={v}")
"""

JOURNALCTL = r"""#!/usr/bin/env python3
import json, os, sys
state = os.environ["STATE"]
args = sys.argv[1:]
if "--sync" in args:
    sys.exit(0)
lines = open(f"{state}/journal").read().splitlines() if os.path.exists(f"{state}/journal") else []
# a line "@T text" was written at T (epoch seconds); the others long before
stamped = [(int(m[1:].split(" ", 1)[0]), m.split(" ", 1)[1]) if m.startswith("@") else (0, m) for m in lines]
entries = [{"__CURSOR": f"c{i}", "MESSAGE": m, "t": t} for i, (t, m) in enumerate(stamped)]
since = next((int(a.split("=@", 1)[1]) for a in args if a.startswith("--since=@")), None)
if since is not None:
    entries = [e for e in entries if e["t"] >= since]
after = next((a.split("=", 1)[1] for a in args if a.startswith("--after-cursor=")), None)
if after is not None:
    entries = entries[int(after[1:]) + 1:]
n = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--lines=")), None)
if n is not None:
    entries = entries[-n:] if n else []
for e in entries:
    print(json.dumps(e))
"""


def props(active: str, sub: str, result: str = "success", code: str = "1", status: str = "0", load: str = "loaded"):
    return {
        "ActiveState": active,
        "SubState": sub,
        "Result": result,
        "ExecMainCode": code,
        "ExecMainStatus": status,
        "InvocationID": "x",
        "Description": "d",
        "LoadState": load,
    }


def load_job_tool():
    """files/glm-flash-job as a module (its directory on sys.path for glm_flash_host: the caller's)."""
    return host_tool("glm-flash-job", "glm_flash_job")


@pytest.fixture
def follow(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("systemctl", SYSTEMCTL), ("journalctl", JOURNALCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("STATE", str(tmp_path))
    monkeypatch.syspath_prepend(str(REPO / "files"))
    module = load_job_tool()

    def run(states: list[dict], journal: list[str] = ()) -> int:
        (tmp_path / "states").write_text(json.dumps(states))
        (tmp_path / "journal").write_text("".join(line + "\n" for line in journal))
        args = type("Args", (), {"name": "glm-flash-model-download.service"})()
        return module.cmd_follow(args, poll=0.01)

    run.module = module
    yield run
    sys.modules.pop("glm_flash_job", None)


def test_a_unit_restarted_by_systemd_is_followed_to_its_success(follow, capsys):
    rc = follow(
        [
            {"props": props("active", "running"), "lines": []},
            {"props": props("active", "running"), "lines": ["fetching: 1 of 2 files"]},
            {
                "props": props("activating", "auto-restart", "exit-code", status="5"),
                "lines": ["download failed: exit 5"],
            },
            {
                "props": props("activating", "auto-restart", "exit-code", status="5"),
                "lines": ["Scheduled restart job, restart counter is at 1."],
            },
            {"props": props("active", "running"), "lines": ["fetching: 2 of 2 files"]},
            {"props": props("inactive", "dead"), "lines": ["verified 2 files"]},
        ],
        journal=["an older run's line", "started"],
    )
    out, err = capsys.readouterr()
    assert rc == 0, err
    # the unit's lines, each once, in order, through the restart; a line from before is not repeated
    said = out.splitlines()
    assert said[-5:] == [
        "fetching: 1 of 2 files",
        "download failed: exit 5",
        "Scheduled restart job, restart counter is at 1.",
        "fetching: 2 of 2 files",
        "verified 2 files",
    ], out
    assert said.count("started") == 1
    assert "following glm-flash-model-download.service" in err
    assert "glm-flash-model-download.service succeeded" in err


def test_a_unit_that_failed_for_good_fails_the_follow_with_its_exit_status(follow, capsys):
    # exit 3 (the hub refused): systemd does not restart it (RestartPreventExitStatus=)
    rc = follow(
        [
            {"props": props("active", "running"), "lines": []},
            {"props": props("failed", "failed", "exit-code", status="3"), "lines": ["the hub refused: gated"]},
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 3
    assert "the hub refused: gated" in out
    assert "failed (failed (failed, result exit-code), exit status 3)" in err


def test_a_unit_that_ended_before_shows_its_last_lines_and_its_result(follow, capsys):
    rc = follow([{"props": props("inactive", "dead")}], journal=[f"line {i}" for i in range(10)])
    out, err = capsys.readouterr()
    assert rc == 0 and out.splitlines() == ["line 6", "line 7", "line 8", "line 9"]
    assert "ended before it was followed" in err


def test_no_such_unit_is_not_a_success(follow, capsys):
    rc = follow([{"props": props("inactive", "dead", load="not-found")}])
    assert rc == 1 and "systemd has no unit glm-flash-model-download.service (not-found)" in capsys.readouterr().err


def test_the_command_line_takes_a_service_name_only(follow, capsys):
    assert follow.module.main(["follow", "x.service; rm -rf /"]) == 2
    assert "is not a service unit's name" in capsys.readouterr().err


def test_start_enables_the_unit_after_resetting_its_failed_state(follow, capsys, tmp_path):
    """`glm-flash-job start UNIT` (the download's start): reset-failed first, so systemd's start
    limit counts from this start, then `enable --now`; silent when it starts."""
    rc = follow.module.main(["start", "glm-flash-model-download.service"])
    assert rc == 0 and capsys.readouterr().err == ""
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == [
        "reset-failed glm-flash-model-download.service",
        "enable --now --quiet glm-flash-model-download.service",
    ]


def test_a_unit_that_does_not_start_fails_with_its_lines_of_this_start_only(follow, capsys, tmp_path):
    (tmp_path / "journal").write_text("an older start's line\n")
    (tmp_path / "start_lines").write_text(json.dumps(["Failed to set up credentials: No such file"]))
    (tmp_path / "enable_rc").write_text("1")
    rc = follow.module.main(["start", "glm-flash-model-download.service"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "Failed to set up credentials: No such file" in err and "an older start's line" not in err, err
    assert "glm-flash-model-download.service did not start. Log: journalctl -u glm-flash-model-download.service" in err
    assert follow.module.main(["start", "x.service; rm -rf /"]) == 2
