"""files/glm-flash-launch's key filter (#36 item 8, L4): a line of the engine holding the API key is
dropped whether the key shows raw, as a Python repr (vLLM 0.24.0 logs its non-default arguments as
one, docs/sources.md) or as a JSON string. A real child process writes into the real pipe."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import host_tool

launch = host_tool("glm-flash-launch", "glm_flash_launch")


def filtered(key: str, lines: list[str]) -> list[str]:
    read_fd, write_fd = os.pipe()
    out_r, out_w = os.pipe()
    code = "import sys; [print(line, flush=True) for line in sys.argv[1:]]"
    child = subprocess.Popen([sys.executable, "-c", code, *lines], stdout=write_fd)
    os.close(write_fd)
    status = launch.filter_lines(launch.key_forms(key), read_fd, out_w, child.pid)
    os.close(out_w)
    with os.fdopen(out_r, "rb") as f:
        got = f.read().decode().splitlines()
    os.close(read_fd)
    assert status == 0
    return got


@pytest.mark.parametrize("key", ['sk-"quote\'d"-0123456789', "sk-back\\slash-0123456789", "sk-plain-0123456789ab"])
def test_a_line_holding_the_key_in_any_printed_form_is_dropped(key):
    lines = [
        "INFO engine starting",
        f"non-default args: {{'api_key': {[key]!r}}}",  # vLLM's repr of its arguments
        f'{{"api_key": {__import__("json").dumps(key)}}}',
        f"raw {key} raw",
        "INFO ready",
    ]
    got = filtered(key, lines)
    assert got[0] == "INFO engine starting" and got[-1] == "INFO ready"
    assert got[1:4] == [launch.DROPPED.decode().strip()] * 3, got
    assert not any(key in line or repr(key)[1:-1] in line for line in got)
