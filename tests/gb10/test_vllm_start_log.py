"""vLLM 0.24.0 logs its non-default arguments at start, the API key among them: files/glm-flash-launch
keeps that line out of the journal.

The real 0.24.0 wheel in the cached parser venv (tests/gb10/vllm_wheel.py) runs the API server's
own start steps (tests/gb10/vllm_log_probe.py: parse, validate, `setup_server`, which calls
`log_non_default_args`) on the GB10 launch flags. vLLM 0.24.0 does not redact `api_key` there
(0.33.0 does; docs/sources.md §20), so the first test shows the key in vLLM's own output, and the
second runs the same steps the way the unit does: files/glm-flash-launch reads a launch spec and
the key from a credentials directory, adds the key flag in-process and filters the engine's output.
Simulated: the GPU (vLLM's CPU platform is set) and the engine, which is never started; the probe
stands in for the spec's module.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from vllm_wheel import parser_python

from control.profile import build
from roles.engines.vllm import launch as vllm_launch

HERE = Path(__file__).resolve().parent
LAUNCH = HERE.parents[1] / "files" / "glm-flash-launch"
CANARY = "sk-canary-7d41e2"
GB10 = {"platform": "gb10", "vllm_ref": "0123456789abcdef0123456789abcdef01234567", "accept_drafter_license": True}


@pytest.fixture(scope="module")
def spec():
    return vllm_launch.launch_spec(build("gx10.example.lan", GB10, api_key_present=True))


def run(argv, **kw):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=HERE, **kw)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    return out


def test_vllm_0_24_itself_logs_the_key(spec):
    # port 0: the probe binds the socket as the server does; any free port will do here
    out = run(
        [
            str(parser_python()),
            str(HERE / "vllm_log_probe.py"),
            *spec["args"],
            "--port",
            "0",
            spec["api_key_flag"],
            CANARY,
        ]
    )
    line = next(line for line in out.splitlines() if "non-default args:" in line)
    assert CANARY in line and "'port': 0" in line


def test_through_glm_flash_launch_the_key_line_is_dropped(spec, tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "api-key").write_text(CANARY + "\n")
    launch = tmp_path / "launch.json"
    launch.write_text(
        json.dumps(
            dict(spec, python=str(parser_python()), module="vllm_log_probe", args=spec["args"] + ["--port", "0"])
        )
    )
    env = dict(os.environ, CREDENTIALS_DIRECTORY=str(creds), PYTHONPATH=str(HERE))
    out = run([str(parser_python()), str(LAUNCH), str(launch)], env=env)
    assert "glm-flash-launch: a line holding the API key was dropped" in out
    assert "non-default args:" not in out  # the key's line, gone whole
    assert CANARY not in out
    assert "vLLM API server version 0.24.0" in out or "0.24.0" in out  # vLLM's own start steps ran
