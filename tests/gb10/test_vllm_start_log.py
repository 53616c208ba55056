"""vLLM 0.33.0 logs its non-default arguments at start: the API key is not among what it shows.

The real 0.33.0 wheel in the cached parser venv (tests/gb10/vllm_wheel.py) runs the API
server's own start steps (tests/gb10/vllm_log_probe.py: parse, configure vLLM's logging,
validate, setup_server) on the GB10 launch flags plus the key flag files/glm-flash-launch
adds in-process. vLLM redacts `api_key` itself (vllm/entrypoints/common/startup.py,
_SENSITIVE_ARG_FIELDS), so patches/vllm carries no edit for it; this test notices if an
engine version stops doing so. Simulated: nothing but the engine itself (no GPU): it is
never started.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from vllm_wheel import parser_python

from control.profile import build
from roles import vllm_launch

HERE = Path(__file__).resolve().parent
CANARY = "sk-canary-7d41e2"
GB10 = {"platform": "gb10", "vllm_ref": "0123456789abcdef0123456789abcdef01234567", "accept_drafter_license": True}


def test_start_log_shows_the_flags_but_not_the_key():
    spec = vllm_launch.launch_spec(build("gx10.example.lan", GB10, api_key_present=True))
    # port 0: the probe binds the socket as the server does; any free port will do here
    argv = spec["args"] + ["--port", "0", spec["api_key_flag"], CANARY]
    r = subprocess.run(
        [str(parser_python()), str(HERE / "vllm_log_probe.py"), json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=HERE,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    line = next(line for line in out.splitlines() if "non-default args:" in line)
    assert "'api_key': '***'" in line and "'port': 0" in line
    assert CANARY not in out
