"""The job operation's command: every value reaches glm-flash-job as one argument, bad input is refused."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
from pyinfra.api import OperationError

from control.layout import FILES
from roles.operations.job import job_command

TOOL = "/opt/glm-flash/bin/glm-flash-job"


def test_values_are_quoted_for_the_shell():
    hostile = ["sh", "-c", "echo 'a b'; touch /tmp/x $(id)", "--", "`reboot`"]
    cmd = job_command(TOOL, "model-download", hostile, user="glm-flash", setenv={"A": "1 2; x"}, watch="/srv/m d")
    argv = shlex.split(cmd.get_raw_value())
    assert argv[:3] == [TOOL, "run", "model-download"]
    assert argv[argv.index("--") + 1 :] == hostile
    assert ["--setenv", "A=1 2; x"] == argv[argv.index("--setenv") : argv.index("--setenv") + 2]
    assert argv[argv.index("--watch") + 1] == "/srv/m d" and argv[argv.index("--user") + 1] == "glm-flash"


@pytest.mark.parametrize(
    "name, command, setenv, problem",
    [
        ("Model_DL", ["true"], None, "lower-case letters"),
        ("../x", ["true"], None, "lower-case letters"),
        ("ok", [], None, "non-empty list"),
        ("ok", "true", None, "non-empty list"),
        ("ok", ["true"], {"A B": "x"}, "not an environment variable name"),
    ],
)
def test_bad_input_is_refused_before_the_host(name, command, setenv, problem):
    with pytest.raises(OperationError, match=problem):
        job_command(TOOL, name, command, setenv=setenv)


def test_the_host_tool_refuses_bad_names_and_a_missing_command():
    tool = str(FILES / "glm-flash-job")
    r = subprocess.run([sys.executable, tool, "run", "Bad/Name", "--", "true"], capture_output=True, text=True)
    assert r.returncode == 2 and "lower-case letters" in r.stderr
    r = subprocess.run([sys.executable, tool, "run", "ok"], capture_output=True, text=True)
    assert r.returncode == 2 and "run needs a command after --" in r.stderr
