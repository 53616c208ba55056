"""One bad host stops only itself, on the real sandbox (issue #10 item 6).

The inventory names the sandbox twice, under two names with the same SSH target: `sandbox` as
inventory/sandbox.py has it, and `sandbox-wrong-box` whose profile says it has GPUs
(require_gpu: true, gpu_count 2) where the sandbox has none (no NVIDIA device on its PCI bus:
roles/hardware.py and the driver role read that). The first converges (zero changes: the
sandbox is deployed already), the second is refused before anything is done on it, the run
ends non-zero and names it and why.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, SANDBOX_INVENTORY, inventory_hosts, pyinfra

pytestmark = pytest.mark.sandbox
BAD = "sandbox-wrong-box"


def test_the_wrong_box_is_refused_and_the_other_converges(sandbox, tmp_path):
    ((name, data),) = inventory_hosts(SANDBOX_INVENTORY)
    hosts = [(name, data), (BAD, {**data, "require_gpu": True, "gpu_count": 2})]
    inventory = tmp_path / "two.py"
    inventory.write_text(f"from control.profile import hosts\n\nhosts = hosts(*{hosts!r})\n")
    run = pyinfra("--json", str(inventory), str(REPO / "deploy.py"))
    err = run.stderr
    assert run.returncode == 1, err[-6000:]
    assert "Traceback" not in err
    assert f"refused: {BAD}: gpu_count: the profile expects 2 NVIDIA GPU" in err and "Fix:" in err
    results = json.loads(run.stdout[run.stdout.index("{") :])["results"]
    assert results["failed_hosts"] == [BAD]
    ops = results["operations"]
    assert not [op["name"] for op in ops if name in op["error"]], "the good host failed somewhere"
    assert not [op["name"] for op in ops if name in op["success"]], "the good host was not converged"
    assert not [op["name"] for op in ops if BAD in op["success"]], "something ran on the refused host"
    first_error = next(op["name"] for op in ops if BAD in op["error"])
    assert first_error.startswith("Refused") or first_error.startswith("GPUs are the profile's"), first_error
