"""Shared fixtures: which inventory the run targets, and the sandbox deploy.

`pytest tests` targets the built-in sandbox: it boots a bare Debian 13 machine, deploys
twice and keeps both runs' pyinfra JSON results for the tests. Against a real host:
`pytest tests/host --inventory inventory/l40s.py [--inventory-host gpu1]` (no deploy): the host,
its address, port, user, key, known_hosts and `_sudo` come from the inventory, as the deploy
reaches it (`--hosts` still overrides them).
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SANDBOX_INVENTORY = "inventory/sandbox.py"


def pytest_addoption(parser):
    parser.addoption("--inventory", default=SANDBOX_INVENTORY, help="inventory file whose profile the host checks use")
    parser.addoption("--no-deploy", action="store_true", help="check the sandbox as it is, without deploying first")
    parser.addoption(
        "--inventory-host", default="", help="which host of --inventory to check (when it has more than one)"
    )


def targets_sandbox(config) -> bool:
    """True when the run checks the built-in sandbox (decided once, before --hosts is filled in)."""
    if not hasattr(config, "_glm_flash_sandbox"):
        config._glm_flash_sandbox = config.getoption("--inventory") == SANDBOX_INVENTORY and not config.getoption(
            "hosts", None
        )
    return config._glm_flash_sandbox


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; reported not applicable where the host has none")
    config.addinivalue_line("markers", "sandbox: deploys to the built-in Debian 13 sandbox")
    if targets_sandbox(config):
        # testinfra reaches the sandbox through the ssh_config `make sandbox-up` writes.
        config.option.hosts = "ssh://sandbox"
        config.option.ssh_config = str(REPO / ".sandbox" / "ssh_config")
    elif not config.getoption("hosts", None) and config.getoption("--inventory") != SANDBOX_INVENTORY:
        name, ssh_config, sudo = inventory_target(config.getoption("--inventory"), config.getoption("--inventory-host"))
        config.option.hosts, config.option.ssh_config = f"ssh://{name}", ssh_config
        config.option.sudo = config.option.sudo or sudo


# pyinfra's ssh connector keys and the ssh_config options they are.
SSH_OPTIONS = {
    "ssh_hostname": "HostName",
    "ssh_port": "Port",
    "ssh_user": "User",
    "ssh_key": "IdentityFile",
    "ssh_known_hosts_file": "UserKnownHostsFile",
    "ssh_strict_host_key_checking": "StrictHostKeyChecking",
}


def inventory_target(path: str, wanted: str) -> tuple[str, str, bool]:
    """(host name, an ssh_config that reaches it as the deploy does, whether to sudo) for the one
    host of inventory `path` (or `wanted` of several)."""
    import tempfile

    entries = inventory_hosts(path)
    names = [name for name, _ in entries]
    if wanted:
        if wanted not in names:
            raise pytest.UsageError(f"{wanted!r} is not a host of {path} (it has: {', '.join(names)})")
        entries = [e for e in entries if e[0] == wanted]
    elif len(entries) != 1:
        raise pytest.UsageError(f"{path} has {len(entries)} hosts; name one: make check INVENTORY={path} HOST=<name>")
    name, data = entries[0]
    lines = [f"Host {name}"]
    for key, option in SSH_OPTIONS.items():
        value = data.get(key)
        if value is None:
            continue
        if key in ("ssh_key", "ssh_known_hosts_file"):
            value = (REPO / Path(str(value)).expanduser()).resolve()
        lines.append(f"  {option} {value}")
    if "ssh_key" in data:
        lines.append("  IdentitiesOnly yes")
    folder = tempfile.mkdtemp(prefix="glm-flash-check-")
    ssh_config = Path(folder) / "ssh_config"
    ssh_config.write_text("\n".join(lines) + "\n")
    return name, str(ssh_config), data.get("_sudo") is True


def inventory_hosts(path: str) -> list[tuple[str, dict]]:
    old = os.getcwd()
    os.chdir(REPO)
    try:
        return runpy.run_path(str(REPO / path))["hosts"]
    finally:
        os.chdir(old)


def pyinfra(*args: str, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def sandbox_sh(command: str, check: bool = True, timeout: int = 1800) -> subprocess.CompletedProcess:
    """Run a shell command on the built-in sandbox (its ssh_config); check=True fails the test on a non-zero exit."""
    r = subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/ssh_config"), "sandbox", command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert r.returncode == 0, f"{command}: {r.stdout}{r.stderr}"
    return r


def service_last_start(unit: str = "glm-flash.service") -> tuple[float, str]:
    """(InactiveExitTimestamp as epoch seconds to the microsecond, InvocationID) of the unit's last start.

    `--timestamp=unix` rounds down to the second, so a start in the same second as a file change
    would look older than it; the deploy's own fact reads microseconds, and so does this.
    """
    from roles.facts.service import ServiceStartState  # the deploy's own parser (the repo is on sys.path by now)

    show = f"systemctl show --timestamp=us+utc -p InactiveExitTimestamp -p InvocationID {unit}"
    lines = sandbox_sh(show).stdout.splitlines()
    invocation = next((line.partition("=")[2] for line in lines if line.startswith("InvocationID=")), "")
    return ServiceStartState.parse(lines).last_start, invocation


def changed_operations(result_json: str) -> list[str]:
    """Names of operations that changed or failed anything, from `pyinfra --json` output."""
    results = json.loads(result_json)["results"]["operations"]
    return [op["name"] for op in results if op["success"] or op["error"]]


class Deploys:
    def __init__(self, first: subprocess.CompletedProcess, second: subprocess.CompletedProcess):
        self.first, self.second = first, second


@pytest.fixture(scope="session")
def sandbox_deploys(request) -> Deploys | None:
    """Deploy a fresh sandbox twice (once per test session); None when targeting another host."""
    config = request.config
    if not targets_sandbox(config) or config.getoption("--no-deploy"):
        return None
    subprocess.run([sys.executable, str(REPO / "sandbox/sandbox.py"), "fresh"], check=True, cwd=REPO)
    first = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")
    assert first.returncode == 0, f"first deploy failed:\n{first.stderr[-6000:]}"
    second = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")
    assert second.returncode == 0, f"second deploy failed:\n{second.stderr[-6000:]}"
    return Deploys(first, second)


@pytest.fixture(scope="session")
def sandbox(request, sandbox_deploys) -> bool:
    """The built-in sandbox is the target and has been deployed (now, or before with --no-deploy)."""
    if not targets_sandbox(request.config):
        pytest.skip("not applicable: needs the built-in sandbox")
    return True
