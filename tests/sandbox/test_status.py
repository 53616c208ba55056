"""`glm-flash status` on the deployed sandbox: what it can check is ok, the GPU items are not
applicable with the reason, and a broken item makes it exit non-zero with the fix.

Simulated: nothing for the baseline (the sandbox has no GPU: that is reported, not faked).
The breakages are real changes on the sandbox, undone before each test ends.
"""

from __future__ import annotations

import json
import shlex

import pytest

from control import layout
from control.defaults import KNOBS
from roles.operations.job import name_released
from tests.conftest import SANDBOX_INVENTORY, changed_operations, pyinfra, sandbox_sh

pytestmark = pytest.mark.sandbox
GPU_ITEMS = ("gpus", "persistence mode", "nvidia module per kernel", "readiness")
MANIFESTS = f"{layout.PATCH_STATE}/manifests"


sh = sandbox_sh


def status() -> tuple[int, dict[str, dict]]:
    r = sh("glm-flash status --json", check=False)
    return r.returncode, {it["item"]: it for it in json.loads(r.stdout)["items"]}


MIN_FREE_GIB = 20  # files/glm-flash MIN_FREE_GIB: under it, the disk item is a problem


def free_gib() -> float:
    """What the sandbox's / has free now (df, not the tool under test): the machine's own disk,
    which this checkout's other lanes share."""
    return int(sh("df -B1 --output=avail / | tail -n 1").stdout) / (1 << 30)


def only_the_disk_may_be_low(rc: int, items: dict[str, dict]) -> None:
    """Every item but the disk is not a problem; the disk item is one exactly when the disk is low
    (within 1 GiB of the bound, both answers hold: the lanes beside this one write while it reads),
    and the exit status follows. A machine with little disk fails no test of status for it."""
    problems = sorted(name for name, it in items.items() if it["state"] == "problem")
    assert problems in ([], ["disk"]), json.dumps(items, indent=1)
    free = free_gib()
    if problems:
        assert free < MIN_FREE_GIB + 1, (free, items["disk"])
    else:
        assert free >= MIN_FREE_GIB - 1, (free, items["disk"])
    assert rc == (1 if problems else 0), (rc, problems)


def problem_line(text: str, name: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("PROBLEM") and f" {name}: " in line]
    assert len(lines) == 1, text
    return lines[0]


def test_sandbox_is_ok_and_gpu_items_not_applicable(sandbox):
    rc, items = status()
    only_the_disk_may_be_low(rc, items)
    for name in GPU_ITEMS:
        assert items[name]["state"] == "n/a" and "no NVIDIA GPU" in items[name]["detail"], items[name]
    # The unit is enabled but its preflight refuses to start it here: not applicable, never ok.
    assert items["service"]["state"] == "n/a" and items["service"]["detail"].startswith("enabled")
    for name in (
        "driver",
        "nvidia repository",
        "cuda header fix",
        "cuda toolkit",
        "engine",
        "engine environment",
        "patch sets",
        "model",
    ):
        assert items[name]["state"] == "ok", items[name]
    assert f"cuDNN {KNOBS['cudnn_version'].default}" in items["engine"]["detail"]


def patched_engine_file() -> tuple[str, str]:
    """(path, patched sha256) of an engine file the deploy's patch manifests record."""
    pattern = repr(f"{MANIFESTS}/*.json")
    code = (
        f"import glob, json; [print(p, e['patched_sha256']) for m in sorted(glob.glob({pattern})) "
        "for p, e in json.load(open(m))['files'].items()]"
    )
    for line in sh(f"python3 -c {shlex.quote(code)}").stdout.splitlines():
        path, digest = line.split()
        if "/engine/envs/" in path:
            return path, digest
    pytest.fail(f"no engine file in {MANIFESTS}")


def flip_last_byte(path: str) -> None:
    # Whitespace for newline and back: the file's own bytes otherwise, so only its hash tells.
    code = (
        "import sys; f = open(sys.argv[1], 'r+b'); f.seek(-1, 2); b = f.read(1); f.seek(-1, 2); "
        "f.write(b' ' if b == b'\\n' else b'\\n'); f.close()"
    )
    sh(f"python3 -c {shlex.quote(code)} {shlex.quote(path)}")


def test_a_changed_byte_in_a_patched_engine_file_is_a_problem_with_its_fix(sandbox):
    """Simulated: someone edits one byte of a file our patch set changed (outside the edit)."""
    path, digest = patched_engine_file()
    assert sh(f"sha256sum {shlex.quote(path)}").stdout.split()[0] == digest
    flip_last_byte(path)
    try:
        r = sh("glm-flash status", check=False)
        assert r.returncode == 1, r.stdout + r.stderr
        line = problem_line(r.stdout, "engine environment")
        assert "files differ from RECORD" in line and "Fix: glm-flash-engine assert-pin" in line and "--force" in line
    finally:
        flip_last_byte(path)
    assert sh(f"sha256sum {shlex.quote(path)}").stdout.split()[0] == digest


def test_a_disabled_service_is_a_problem_and_the_deploy_converges_back(sandbox):
    """Simulated: an operator stops and disables glm-flash.service (on the sandbox it is never
    running, no GPU; what status sees is that it is no longer enabled). It starts from the unit as
    a deploy leaves it here, not failed: a rollback before (test_engine_upgrade) leaves it failed,
    and systemd keeps a failed unit loaded, with its start record, after disable --now."""
    sh("systemctl reset-failed glm-flash.service; systemctl disable --now glm-flash.service")
    # systemd drops the disabled, stopped unit (and its start record) when it next looks at it; on a
    # loaded machine it kept it once (a cold CI run: the deploy then found the start record and
    # started nothing): asked again until it is gone, as a deploy does before reusing a job's name
    sh(name_released("glm-flash.service"))
    assert sh("systemctl list-units --all --plain --no-legend glm-flash.service").stdout.strip() == ""
    r = sh("glm-flash status", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Fix: systemctl enable --now glm-flash.service" in problem_line(r.stdout, "service")
    run = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")
    assert run.returncode == 0, run.stderr[-6000:]
    # stopped and disabled, systemd drops the unit and its start record: enabled again, its
    # start is tried (roles/operations/service_restart.py), and refused here for want of a GPU
    assert changed_operations(run.stdout) == [
        "Enable glm-flash.service",
        "glm-flash.service started from the files on disk",
    ]
    rc, items = status()
    only_the_disk_may_be_low(rc, items)
    assert items["service"]["state"] == "n/a", items["service"]
