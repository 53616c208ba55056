"""The API key stays out of the journal, in the deployed sandbox.

- The installed engine's own (patched) `ServerArgs` from the engine environment's python:
  its repr, which sglang-kt logs at start as `server_args=...`, lacks a canary key. The
  instance is made without __post_init__ (that needs a GPU and a model); the repr is the
  dataclass's own, built from its fields.
- The unit's LogFilterPatterns= backstop, through the real journald: a drop-in under /run
  makes the deployed unit's start print key-carrying lines (the forms sglang-kt and a
  bearer header would have) and plain ones; the journal keeps only the plain ones.
"""

from __future__ import annotations

import pytest

from tests.conftest import sandbox_sh
from tests.sandbox.test_unit_hardening import put, start_and_log

pytestmark = pytest.mark.sandbox
PY = "/opt/glm-flash/engine/current/bin/python"  # install_root of inventory/sandbox.py
CANARY = "sk-canary-51be07"
DROPIN = "/run/systemd/system/glm-flash.service.d/test-log.conf"

REPR = f"""
import dataclasses
from sglang.srt.server_args import ServerArgs
args = object.__new__(ServerArgs)
for f in dataclasses.fields(ServerArgs):
    default = f.default if f.default is not dataclasses.MISSING else None
    object.__setattr__(args, f.name, default)
args.model_path = "/srv/models/GLM-5.3-Flash"
args.api_key = args.admin_api_key = {CANARY!r}
print(repr(args))
"""


def test_installed_server_args_repr_lacks_the_key(sandbox):
    out = sandbox_sh(f"{PY} - <<'EOF'\n{REPR}\nEOF", timeout=300).stdout
    assert out.startswith("ServerArgs(") and "model_path='/srv/models/GLM-5.3-Flash'" in out, out[-2000:]
    assert CANARY not in out and "api_key" not in out


@pytest.fixture
def noisy_start():
    lines = [
        f"server_args=ServerArgs(model_path='/srv/m', api_key='{CANARY}')",
        f"Authorization: Bearer {CANARY}",
        f'{{"api-key": "{CANARY}"}}',
        "probe-plain-line",
        "server_args=ServerArgs(model_path='/srv/m', api_key=None) probe-none",
    ]
    steps = "".join(f"ExecStartPre=/bin/echo {line}\n" for line in lines)
    put(DROPIN, f"[Service]\nExecStartPre=\n{steps}ExecStartPre=/bin/false\n")
    sandbox_sh("systemctl daemon-reload")
    try:
        yield
    finally:
        sandbox_sh(f"rm -f {DROPIN} && systemctl daemon-reload", check=False)


def test_journal_drops_lines_carrying_a_key(sandbox, noisy_start):
    shown = sandbox_sh("systemctl show -p LogFilterPatterns --value glm-flash.service").stdout
    assert shown.startswith("~"), "the deployed unit has the filter (systemd 257)"
    _, log, _ = start_and_log()
    assert "probe-plain-line" in log and "probe-none" in log, log
    assert CANARY not in log, log
