"""Preflight and the end-of-deploy summary against the deployed sandbox.

The sandbox passes preflight with its own inventory values (its 2 cores, its memory, the real
free disk); a knob asking for more than the machine has refuses that host, before any change,
while a second inventory host on the same machine converges. Nothing simulated: the summary is
read from the sandbox's own `glm-flash status --json` and checked against the host's state.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import REPO, SANDBOX_INVENTORY, changed_operations, pyinfra, sandbox_sh

pytestmark = pytest.mark.sandbox
PREFLIGHT = "Preflight: disk, cores, CPU features and memory for this profile"


def summary_of(tmp_path, monkeypatch, *args: str):
    path = tmp_path / "summary.json"
    monkeypatch.setenv("GLM_FLASH_SUMMARY_JSON", str(path))
    r = pyinfra("--json", *args, timeout=1800)
    return r, json.loads(path.read_text())["hosts"] if path.exists() else None


def test_converged_deploy_passes_preflight_and_ends_with_the_summary(sandbox, tmp_path, monkeypatch):
    r, hosts = summary_of(tmp_path, monkeypatch, SANDBOX_INVENTORY, "deploy.py")
    assert r.returncode == 0, r.stderr[-4000:]
    assert changed_operations(r.stdout) == []  # stdout is pyinfra's JSON; the summary went to stderr
    s = hosts["sandbox"]
    assert s["result"] == "deployed" and s["refused"] == []
    engine_port = json.loads((REPO / ".sandbox/ports.json").read_text())["engine"]  # the inventory's port
    assert s["endpoint"] == f"http://127.0.0.1:{engine_port}/v1" and s["model_name"] == "glm-5.3-flash"
    assert s["serving"] is False and s["readiness"].startswith("n/a: ")  # no GPU: nothing serves
    current = sandbox_sh("basename $(readlink -f /opt/glm-flash/engine/current)").stdout.strip()
    assert s["engine_set"] == "0.7.0.post1" and s["environment"] == current
    assert s["driver_branch"] == "590" and s["toolkit"].startswith("ok: CUDA 12.8")
    assert s["model"].startswith("ok: ")
    # The problems are the host's own (e.g. a shared disk running low), as glm-flash status says.
    items = json.loads(sandbox_sh("glm-flash status --json --quick", check=False).stdout)["items"]
    assert s["problems"] == [f"{it['item']}: {it['detail']}" for it in items if it["state"] == "problem"]
    assert isinstance(s["reboot_pending"], list)
    assert {
        "step": "start glm-flash.service",
        "reason": "no NVIDIA GPU on this host; a start is tried once when its files changed, and its preflight refuses",
    } in s["skipped"]
    assert "--> Summary" in r.stderr and "    [sandbox] deployed" in r.stderr
    assert f"environment: {current}" in r.stderr


def test_a_shortfall_refuses_that_host_only_before_any_change(sandbox, tmp_path, monkeypatch):
    free = shutil.disk_usage(REPO / ".sandbox").free  # the sandbox's rootfs is a directory on this disk
    inventory = tmp_path / "two.py"
    inventory.write_text(
        "import runpy\n"
        f"good = runpy.run_path({SANDBOX_INVENTORY!r})['hosts'][0][1]\n"
        "bad = dict(good, preflight_model_gib=1e6, kt_cpuinfer=64, preflight_cpu_flags=['avx2', 'no_such_cpu_flag'])\n"
        "hosts = [('sandbox', good), ('sandbox-short', bad)]\n"
    )
    r, hosts = summary_of(tmp_path, monkeypatch, str(inventory), "deploy.py")
    assert r.returncode != 0
    ops = json.loads(r.stdout)["results"]["operations"]
    assert [op["name"] for op in ops if op["success"]] == []  # nothing changed on either host
    assert ops[0]["name"] == PREFLIGHT and ops[0]["error"] == ["sandbox-short"]
    assert all(op["error"] == ["sandbox-short"] and op["no_change"] == ["sandbox"] for op in ops)
    assert "sandbox-short: preflight: this host cannot take the deploy; nothing was changed on it." in r.stderr
    # Once where the host is refused, once in the summary at the end.
    said = [line[line.index("- disk: ") :] for line in r.stderr.splitlines() if "- disk: " in line]
    disk, again = said
    assert disk == again
    free_said = float(disk.split("- disk: ")[1].split(" GiB free on /,")[0])
    assert abs(free_said - free / (1 << 30)) < 2, disk  # what is really free, against
    needed = float(disk.split(" GiB free on /, ")[1].split(" GiB needed there")[0])
    # the model less what model_path holds, plus environments not built yet (none or one, by test order)
    assert 1e6 - 1 <= needed < 1e6 + 20, disk
    assert "- kt_cpuinfer: 64 CPU-expert threads, the box has 2 physical cores" in r.stderr
    # A flag no CPU has is named; one this CPU has (x86-64-v3, as every machine here) is not.
    cpu = [line for line in r.stderr.splitlines() if "- CPU: " in line]
    assert cpu and "lacks no_such_cpu_flag (/proc/cpuinfo)" in cpu[0], cpu
    assert hosts["sandbox"]["result"] == "deployed"
    assert hosts["sandbox-short"]["result"] == "refused"
    assert any("kt_cpuinfer: 64" in line for line in hosts["sandbox-short"]["refused"])
