"""Every host tool in files/ answers --help with its usage and exit status 0, and does nothing
else (issue 39: glm-flash-notify took --help for a unit name, recorded a failure and told the
webhook). Each runs in bubblewrap with the whole machine read-only:
a tool that took --help for work could write nothing, and would fail here instead."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO

TOOLS = sorted(p for p in (REPO / "files").glob("glm-flash*") if p.is_file())


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (make deps)")
@pytest.mark.parametrize("tool", TOOLS, ids=lambda p: p.name)
def test_every_host_tool_answers_help(tool):
    shell = "sh" if tool.read_text().startswith("#!/bin/sh") else "python3"
    box = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net", "--die-with-parent"]
    done = subprocess.run([*box, shell, str(tool), "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert tool.name in done.stdout and "Traceback" not in done.stderr
