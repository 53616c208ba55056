"""The API key stays out of the journal, in the deployed sandbox.

- The installed engine's own (patched) `ServerArgs` from the engine environment's python:
  its repr, which sglang-kt logs at start as `server_args=...`, lacks a canary key. The
  instance is made without __post_init__ (that needs a GPU and a model); the repr is the
  dataclass's own, built from its fields.
- The launcher's line filter, through the real journald: a drop-in under /run gives the
  deployed unit a canary key as its `api-key` credential and starts, through the deployed
  files/glm-flash-launch, a stand-in engine module that prints the key it was handed (on
  stdout, stderr and from a child process, in the forms sglang-kt and a bearer header would
  have, and bare) and plain lines. Every start's journal keeps the plain lines and none holds
  the key, whether or not journald resolved the unit's cgroup (where it does not, the unit's
  LogFilterPatterns= backstop does not apply: about 1 start in 4 in nspawn).
  Simulated: the engine (no GPU to run it), a module run by the real launcher.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import sandbox_sh
from tests.sandbox.test_unit_hardening import put

pytestmark = pytest.mark.sandbox
PY = "/opt/glm-flash/engine/current/bin/python"  # install_root of inventory/sandbox.py
CANARY = "sk-canary-51be07"
DROPIN = "/run/systemd/system/glm-flash.service.d/test-log.conf"
TEST_DIR = "/run/glm-flash-test"
LAUNCH = "/opt/glm-flash/bin/glm-flash-launch"  # bin of inventory/sandbox.py
UNIT = "glm-flash.service"
DROPPED = "glm-flash-launch: a line holding the API key was dropped"

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


# The stand-in engine: prints the key the launcher handed it (--api-key), as an engine could.
ENGINE = """
import subprocess, sys
key = sys.argv[sys.argv.index("--api-key") + 1]
print(f"server_args=ServerArgs(model_path='/srv/m', api_key='{key}')", flush=True)
print(f"Authorization: Bearer {key}", file=sys.stderr, flush=True)
print("probe-plain-line", flush=True)
subprocess.run([sys.executable, "-c", f"print('worker handed ' + {key!r}); print('probe-worker-line')"])
print("server_args=ServerArgs(model_path='/srv/m', api_key=None) probe-none")
print(f"a bare {key} mid-line", file=sys.stderr)
"""


@pytest.fixture
def noisy_start():
    put(f"{TEST_DIR}/probe_engine.py", ENGINE)
    put(f"{TEST_DIR}/api-key", CANARY + "\n")
    spec = {"python": PY, "module": "probe_engine", "args": [], "api_key_flag": "--api-key"}
    put(f"{TEST_DIR}/launch.json", json.dumps(spec) + "\n")
    sandbox_sh(
        f"chmod 755 {TEST_DIR} && chmod 644 {TEST_DIR}/probe_engine.py {TEST_DIR}/launch.json && chmod 600 {TEST_DIR}/api-key"
    )
    dropin = (
        "[Service]\nExecStartPre=\nExecStartPost=\nExecStart=\n"
        f"ExecStart={LAUNCH} {TEST_DIR}/launch.json\n"
        f"LoadCredential=api-key:{TEST_DIR}/api-key\nEnvironment=PYTHONPATH={TEST_DIR}\nRestart=no\n"
    )
    put(DROPIN, dropin)
    sandbox_sh("systemctl daemon-reload")
    try:
        yield
    finally:
        sandbox_sh(
            f"systemctl stop {UNIT}; rm -rf {DROPIN} {TEST_DIR} && systemctl daemon-reload; systemctl reset-failed {UNIT}",
            check=False,
        )


def run_once(timeout: float = 120) -> tuple[str, str]:
    """Start the unit, wait (bounded) until the stand-in engine has exited by itself; (its log, invocation)."""
    sandbox_sh(f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}", check=False)
    sandbox_sh(f"systemctl start {UNIT}")
    inv = sandbox_sh(f"systemctl show -p InvocationID --value {UNIT}").stdout.strip()
    deadline = time.monotonic() + timeout
    while sandbox_sh(f"systemctl is-active {UNIT}", check=False).stdout.strip() in (
        "active",
        "activating",
        "deactivating",
    ):
        assert time.monotonic() < deadline, f"the stand-in engine still runs after {timeout} s"
        time.sleep(0.2)
    result = sandbox_sh(f"systemctl show -p Result --value {UNIT}").stdout.strip()
    assert result == "success", result
    # --sync: lines still queued in journald's stream socket are read in first (systemd >= 256)
    log = sandbox_sh(
        f"journalctl --sync; journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={inv} + INVOCATION_ID={inv}"
    ).stdout
    return log, inv


def attributed(inv: str) -> bool:
    """journald resolved the cgroup of the process that printed the lines (_SYSTEMD_CGROUP set)."""
    out = sandbox_sh(f"journalctl -o verbose _SYSTEMD_INVOCATION_ID={inv} MESSAGE=probe-plain-line").stdout
    return "_SYSTEMD_CGROUP=/system.slice/glm-flash.service" in out


def test_journal_drops_lines_carrying_a_key(sandbox, noisy_start):
    """Every start: the plain lines reach the journal and no line holds the key, whether or not
    journald could attribute the start to the unit (and so apply LogFilterPatterns=)."""
    shown = sandbox_sh(f"systemctl show -p LogFilterPatterns --value {UNIT}").stdout
    assert shown.startswith("~"), "the deployed unit keeps the filter as a backstop (systemd 257)"
    since = sandbox_sh("date +%s.%N").stdout.strip()
    seen = []
    for _ in range(8):
        log, inv = run_once()
        for plain in ("probe-plain-line", "probe-worker-line", "probe-none"):
            assert plain in log, log
        assert CANARY not in log, "a line holding the key reached the journal"
        assert log.count(DROPPED) == 4, log  # server_args, the bearer header, the worker's line, the bare key
        seen.append(attributed(inv))
    # Nowhere in the journal since the first start, in any field, attributed to any unit or none.
    export = sandbox_sh(f"journalctl --sync; journalctl --no-pager -o export --since @{since}").stdout
    assert CANARY not in export, "the key is in the journal"
    print(f"starts journald attributed to the unit: {seen.count(True)} of {len(seen)}")
