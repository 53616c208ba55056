"""Bad inventories, through the real pyinfra CLI (`python -m pyinfra -y INVENTORY deploy.py`, from
the repo as the README says): each is refused while pyinfra loads it, before any host is
contacted, with the host, the key, the problem and the fix, and without a traceback; written
with the `hosts()` helper or as a plain pyinfra list.

"Nothing contacted" is observed, not assumed: every host's address is a TCP listener on
loopback that counts the connections it accepts (an SSH connection attempt would be one, and
would hang there). test_the_listener_sees_a_real_connection shows it counts one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from control.defaults import HOST_PATH, KNOBS, LOCAL_PATH
from tests.conftest import REPO

REF = "0123456789abcdef0123456789abcdef01234567"
GB10 = {"platform": "gb10", "vllm_ref": REF, "accept_drafter_license": True}
LISTENER_PORT = "LISTENER"  # replaced by the listener's port in every host's data
UNSET = "UNSET"  # a key every host sets (strict host key checking) left out
PATH_KNOBS = [k for k, knob in KNOBS.items() if knob.pattern in (HOST_PATH["pattern"], LOCAL_PATH["pattern"])]

# host name: (data, key, words of the problem, words of the fix)
CASES = {
    "typo-pyinfra-key": (
        {"ssh_known_host_file": "inventory/known_hosts"},
        "ssh_known_host_file",
        "not one that pyinfra",
        "did you mean 'ssh_known_hosts_file'?",
    ),
    "typo-knob": ({"tp_szie": 2}, "tp_szie", "unknown key", "did you mean 'tp_size'?"),
    "lookalike-key": (
        {"model_p\u0430th": "/srv/models/x"},
        "model_p\u0430th",
        "U+0430 CYRILLIC SMALL LETTER A",
        "'model_path'",
    ),
    "gb10-two-gpus": ({**GB10, "gpu_count": 2}, "gpu_count", "above the maximum 1 on gb10", "up to 1"),
    "gb10-python": ({**GB10, "python_version": "3.11"}, "python_version", "on gb10", "listed values"),
    "l40s-sm121": ({"gpu_compute_capability": "12.1"}, "gpu_compute_capability", "on l40s", "listed values"),
    "placeholder-ref": ({**GB10, "vllm_ref": "0" * 40}, "vllm_ref", "placeholder (forty zeros)", "git ls-remote"),
    "placeholder-url": (
        {"apt_mirror": "http://mirror.example.lan/debian"},
        "apt_mirror",
        "placeholder",
        "the real address",
    ),
    "unsafe-path-space": ({"install_root": "/opt/glm flash"}, "install_root", "is not an absolute path", "write"),
    "unsafe-path-dotdot": ({"model_path": "/srv/../etc"}, "model_path", "is not an absolute path", "write"),
    "unsafe-path-subst": ({"drafter_path": "/srv/$(id)"}, "drafter_path", "is not an absolute path", "write"),
    "newline-unit-line": (
        {"served_model_name": "glm\nExecStartPre=+/bin/sh -c id"},
        "served_model_name",
        "U+000A LINE FEED (newline)",
        "remove it",
    ),
    "escape-char": ({"model_id": "zai-org/GLM\x1b[2J"}, "model_id", "U+001B ESCAPE", "remove it"),
    "shell-semicolon": ({"model_revision": "main;id"}, "model_revision", "is not a git branch", "write"),
    "systemd-specifier": ({"served_model_name": "glm%n"}, "served_model_name", "is not a model name", "write"),
    "space-in-env": ({"pytorch_alloc_conf": "a:1 b:2"}, "pytorch_alloc_conf", "no spaces", "write"),
    "port-is-ssh": ({"port": LISTENER_PORT}, "port", "is the port SSH connects to", "another port"),
    "privileged-port": ({"port": 80}, "port", "below the minimum 1024", "from 1024 up"),
    "mem-fraction-nan": ({"mem_fraction_static": float("nan")}, "mem_fraction_static", "not a finite", "write"),
    "mem-fraction-inf": ({"mem_fraction_static": float("inf")}, "mem_fraction_static", "not a finite", "write"),
    "unit-name-not-a-string": (
        {"display_managers": ["gdm3", 7]},
        "display_managers",
        "item 2, 7, is int, not a systemd unit name",
        "write every item as a string",
    ),
    **{
        f"relative-{key.replace('_', '-')}": ({key: "relative/dir"}, key, "is not an absolute path", "/")
        for key in PATH_KNOBS
    },
}


class Listener:
    """A TCP port on loopback that counts the connections it accepts, and drops them."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self):
        self.sock.close()


def pyinfra(inventory: Path, *operations: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("GLM_FLASH_API_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(inventory), *(operations or ["deploy.py"])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def entries(port: int) -> list[tuple[str, dict]]:
    out = []
    for host, (data, *_) in CASES.items():
        data = {"ssh_strict_host_key_checking": "yes", **data}
        data = {k: (port if v == LISTENER_PORT else v) for k, v in data.items() if v != UNSET}
        out.append((host, {"ssh_hostname": "127.0.0.1", "ssh_port": port, **data}))
    return out


def write(path: Path, source: str) -> Path:
    path.write_text(source, encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=["hosts() helper", "plain pyinfra list"])
def refused(request, tmp_path_factory):
    """One pyinfra run over an inventory holding every case (a host each): all are reported at once."""
    listener = Listener()
    try:
        hosts = entries(listener.port)
        path = tmp_path_factory.mktemp("inv") / "bad.py"
        floats = "from math import inf, nan\n\n"  # repr() of the NaN and infinity cases
        if request.param == "hosts() helper":
            write(path, f"{floats}from control.profile import hosts\n\nhosts = hosts(*{hosts!r})\n")
        else:
            write(path, f"{floats}hosts = {hosts!r}\n")
        run = pyinfra(path)
    finally:
        listener.close()
    return run, listener.connections


def assert_refused_before_contact(run, connections: int) -> str:
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert "no host was changed" in out and "Traceback" not in out and "Connecting to hosts" not in out, out
    assert connections == 0, "a host was contacted"
    return out


@pytest.mark.parametrize("host", list(CASES))
def test_bad_inventory_names_host_key_problem_and_fix(refused, host):
    run, connections = refused
    out = assert_refused_before_contact(run, connections)
    _, key, problem, fix = CASES[host]
    lines = [line for line in out.splitlines() if line.strip().startswith(f"- {host}: {key}: ")]
    assert lines, f"no line for {host}: {key}\n{out}"
    (line,) = lines
    said, _, fixed = line.partition(". Fix: ")
    assert problem in said and fix in fixed, line


@pytest.mark.parametrize(
    "source, words",
    [
        ("hosts = []\n", "names no host at all"),
        ("from control.profile import hosts\n\nhosts = hosts()\n", "names no host at all"),
        ("HOSTS = 'gpu1.lan'\n", "names no host at all"),
        ("gpus = (['gpu1.invalid', 'gpu2.invalid'], {'tp_szie': 2})\n", "gpu1.invalid: tp_szie: unknown key"),
        ("gpus = ('gpu1.invalid', 'gpu2.invalid')\n", "pyinfra reads a tuple as (hosts, data)"),
    ],
    ids=["empty list", "empty hosts()", "no group", "group with data", "tuple of names"],
)
def test_inventories_that_name_no_usable_host(tmp_path, source, words):
    run = pyinfra(write(tmp_path / "inv.py", source))
    out = assert_refused_before_contact(run, 0)
    assert words in out and "Fix: " in out


def test_the_listener_sees_a_real_connection(tmp_path):
    """The control: a good inventory is contacted, and the listener counts it."""
    listener = Listener()
    try:
        data = {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": listener.port,
            "ssh_connect_retries": 0,
            "ssh_strict_host_key_checking": "yes",
        }
        run = pyinfra(write(tmp_path / "good.py", f"hosts = [('good-host', {data!r})]\n"))
    finally:
        listener.close()
    assert "Connecting to hosts" in run.stderr + run.stdout
    assert listener.connections >= 1


def test_a_host_another_helper_checked_is_left_to_it(tmp_path):
    """An inventory helper with its own knobs (control/fleet.py's gateway) says so with checked();
    without that, the host's data is checked as a node's, and refused. `debug-inventory` loads
    the inventory (group_data/all.py included) and connects to nothing."""
    gateway = "[('gw.invalid', {'gateway_policy': 'cache_aware', 'ssh_strict_host_key_checking': 'yes'})]"
    own = write(tmp_path / "own.py", f"from control.profile import checked\n\ngateway = {gateway}\nchecked(gateway)\n")
    run = pyinfra(own, "debug-inventory")
    assert run.returncode == 0 and "gateway_policy" in run.stdout + run.stderr, run.stdout + run.stderr
    run = pyinfra(write(tmp_path / "plain.py", f"gateway = {gateway}\n"), "debug-inventory")
    assert run.returncode == 2 and "gw.invalid: gateway_policy: unknown key" in run.stderr, run.stderr


@pytest.mark.parametrize("helper", [True, False], ids=["hosts() helper", "plain pyinfra list"])
@pytest.mark.parametrize("value, said", [(UNSET, "is not set"), ("accept-new", "is 'accept-new'"), ("no", "is 'no'")])
def test_a_host_without_strict_host_key_checking_is_refused(tmp_path, helper, value, said):
    """pyinfra would trust the key of whatever answers on first contact (accept-new), on the run
    that ships the API key and the hub token: refused for every SSH host, loopback included."""
    listener = Listener()
    try:
        data = {"ssh_hostname": "127.0.0.1", "ssh_port": listener.port, "ssh_strict_host_key_checking": value}
        data = {k: v for k, v in data.items() if v != UNSET}
        host = [("no-host-key", data)]
        source = f"from control.profile import hosts\n\nhosts = hosts(*{host!r})\n" if helper else f"hosts = {host!r}\n"
        run = pyinfra(write(tmp_path / "inv.py", source))
    finally:
        listener.close()
    out = assert_refused_before_contact(run, listener.connections)
    assert f"- no-host-key: ssh_strict_host_key_checking: {said}: a host whose key is not known" in out, out
    assert "Fix: set ssh_strict_host_key_checking: 'yes'" in out, out
