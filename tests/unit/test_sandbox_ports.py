"""Two checkouts on one machine: their sandboxes must not share a machine name, a port or an address.

The old sandbox named its machine after its port and took 2222 (8222, 9222) by default, so two
checkouts with defaults fought over one machine and one sshd port. Each test here loads
sandbox/sandbox.py (and sandbox/fleet.py) from two copies of the tool at different paths, as two
checkouts are, and holds sockets as the other checkout's running servers would.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import sys

import pytest

from tests.conftest import REPO

PINS = ("GLM_FLASH_SANDBOX_PORT", "GLM_FLASH_STANDIN_PORT", "GLM_FLASH_HUB_PORT")


def load(root, name: str):
    spec = importlib.util.spec_from_file_location(f"_{name}_{abs(hash(str(root)))}", root / "sandbox" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def checkouts(tmp_path, monkeypatch):
    for name in PINS:
        monkeypatch.delenv(name, raising=False)
    roots = []
    for name in ("a", "b"):
        root = tmp_path / name / "glm-flash"
        shutil.copytree(REPO / "sandbox", root / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
        roots.append(root)
    monkeypatch.syspath_prepend(str(roots[0] / "sandbox"))  # fleet.py imports `sandbox` beside it
    # ... which must be the copy's sandbox.py, not the repo's `sandbox` package an earlier test
    # imported (`from sandbox.fake_hub import ...`): which ran first decided it before.
    sys.modules.pop("sandbox", None)
    yield roots
    sys.modules.pop("sandbox", None)


def listen(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_two_checkouts_get_their_own_machine_and_ports(checkouts):
    a, b = (load(root, "sandbox") for root in checkouts)
    assert a.IDENTITY != b.IDENTITY and a.MACHINE != b.MACHINE
    assert a.MACHINE == f"glm-flash-sandbox-{a.IDENTITY}"
    assert load(checkouts[0], "sandbox").MACHINE == a.MACHINE  # stable for one checkout
    ports_a = a.settle_ports()
    held = [listen(p) for p in ports_a.values()]  # checkout a's sandbox is up: sshd, stand-in, hub
    try:
        ports_b = b.settle_ports()
    finally:
        for s in held:
            s.close()
    assert set(ports_a.values()).isdisjoint(ports_b.values()), (ports_a, ports_b)
    assert {2222, 8222, 9222}.isdisjoint([*ports_a.values(), *ports_b.values()])
    # recorded in each checkout's own state, which the inventories and the ssh_config read
    assert json.loads((checkouts[0] / ".sandbox/ports.json").read_text()) == ports_a
    assert json.loads((checkouts[1] / ".sandbox/ports.json").read_text()) == ports_b
    assert len(set(ports_b.values())) == len(b.PORT_ENV) == 8
    assert {30000, 9100, 19090, 18099}.isdisjoint([*ports_a.values(), *ports_b.values()])


def test_the_choice_refuses_a_port_already_held(checkouts):
    sb = load(checkouts[0], "sandbox")
    first = sb.pick_ports(["ssh"], set())["ssh"]
    with listen(first):
        assert not sb.bindable(first)
        again = sb.pick_ports(["ssh"], set())["ssh"]
    assert again != first
    # a recorded port someone took while the sandbox was down is chosen afresh, and said so
    (checkouts[0] / ".sandbox").mkdir()
    (checkouts[0] / ".sandbox/ports.json").write_text(json.dumps({"ssh": first, "standin": again, "hub": again + 1}))
    with listen(first):
        ports = sb.settle_ports()
    assert ports["ssh"] != first and ports["standin"] == again


def test_pinned_ports_win_and_follow_the_old_offsets(checkouts, monkeypatch):
    monkeypatch.setenv("GLM_FLASH_SANDBOX_PORT", "2400")
    sb = load(checkouts[0], "sandbox")
    assert (sb.PORT, sb.STANDIN_PORT, sb.HUB_PORT) == (2400, 8400, 9400)
    ports = sb.settle_ports()
    assert {k: ports[k] for k in ("ssh", "standin", "hub")} == {"ssh": 2400, "standin": 8400, "hub": 9400}
    assert len(set(ports.values())) == len(sb.PORT_ENV)  # the others chosen, none of them the pinned ones


def test_two_checkouts_fleets_use_their_own_addresses_and_names(checkouts):
    fa = load(checkouts[0], "fleet")
    sys.modules.pop("sandbox", None)
    sys.path.insert(0, str(checkouts[1] / "sandbox"))
    try:
        fb = load(checkouts[1], "fleet")
    finally:
        sys.path.remove(str(checkouts[1] / "sandbox"))
    assert fa.sb.IDENTITY != fb.sb.IDENTITY
    assert fa.machine(1) != fb.machine(1)
    assert fa.address(1) != fb.address(1)  # the peer port 30080, the engines' and sshd's ports cannot meet
    for f in (fa, fb):
        assert f.address(1).startswith("127.") and not f.address(1).startswith("127.0.0.")
