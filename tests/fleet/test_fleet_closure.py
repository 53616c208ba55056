"""The closure hash on the fleet sandbox's workers: `glm-flash closure --json` (files/glm-flash) run
on two workers by their own systemd and python, and the summary's grouping (roles/summary.py).

Simulated: these bare workers cannot run the full deploy (no GPU, no engine), so the test puts on
each worker what the deploy writes there and the closure reads, rendered by the deploy's own code
for that worker's profile from the fleet inventory: the engine unit and glm-flash-gpu.service
(templates, roles/service.py unit_context), the environment file, /etc/glm-flash/status.json
(roles/status.py) and a launch.json carrying the worker's own address (the real one is the engine's
parsed flags). Driver, toolkit, engine environment, patch sets are absent on both workers alike.
Debian's python3 is installed on the workers for the tool (a deployed node has it).
"""

from __future__ import annotations

import json
from io import StringIO

import jinja2
import pytest

from control.profile import build
from roles import service, status
from roles.summary import closures
from tests.conftest import REPO
from tests.fleet.conftest import kept, ssh
from tests.fleet.test_gateway_fleet import inventory

pytestmark = pytest.mark.sandbox
DROPIN = "/etc/systemd/system/glm-flash.service.d/hand-edit.conf"


def put(node: str, path: str, text: str, mode: str = "644") -> None:
    q = path.replace("'", "")
    run = ssh(node, f"mkdir -p \"$(dirname '{q}')\" && cat > '{q}' && chmod {mode} '{q}'", text)
    assert run.returncode == 0, run.stderr


def files_for(name: str, data: dict) -> dict[str, str]:
    p = build(name, data, api_key_present=True)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(REPO / "templates"), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    render = lambda t, **ctx: env.get_template(t).render(**ctx)  # noqa: E731
    own = p.fleet_own_address
    return {
        "/etc/systemd/system/glm-flash.service": render("glm-flash.service.j2", **service.unit_context(p, True, 257)),
        "/etc/systemd/system/glm-flash-gpu.service": render("glm-flash-gpu.service.j2"),
        "/etc/glm-flash/glm-flash.env": render(
            "glm-flash.env.j2", state_dir=service.state_dir(p), extra_env={"SGLANG_X": "1"}
        ),
        "/etc/glm-flash/launch.json": json.dumps({"args": ["--host", own, "--port", str(p.port)]}, indent=2) + "\n",
        "/etc/glm-flash/status.json": json.dumps(status.values(p), indent=1, sort_keys=True) + "\n",
        f"{p.install_root}/bin/glm-flash": (REPO / "files" / "glm-flash").read_text(),
    }, p


def closure_of(node: str, tool: str) -> dict:
    run = ssh(node, f"python3 {tool} closure --json")
    assert run.returncode == 0, run.stderr
    return json.load(StringIO(run.stdout))


def test_two_workers_from_one_commit_share_a_closure_and_a_hand_edit_is_named(fleet_up):
    inv = inventory()
    workers = inv["workers"][:2]
    # The fleet sandbox has N=3 machines, two of them workers: fewer is a broken fleet, not a pass.
    assert len(workers) == 2, f"the fleet inventory names {len(workers)} workers, not 2 (make fleet-up N=3)"
    by_address = {n["address"]: n["name"] for n in fleet_up}
    planned = [files_for(name, data) for name, data in workers]
    nodes = [by_address[p.fleet_own_address] for _, p in planned]
    tools = [f"{p.install_root}/bin/glm-flash" for _, p in planned]
    # What the test writes is put back after it: on the fleet built from the deployed sandbox these
    # are the deploy's own files, which tests/fleet/test_fleet_deploy.py deploys over next.
    written = sorted({DROPIN.rsplit("/", 1)[0], "/etc/glm-flash", *planned[0][0]})
    with kept(nodes, written):
        for (files, _), node in zip(planned, nodes):
            have = ssh(
                node,
                "python3 -c 'import shutil, concurrent.futures' 2>/dev/null || (apt-get update -q && apt-get install -y -q python3)",
            )
            assert have.returncode == 0, have.stdout[-2000:] + have.stderr[-2000:]
            for path, text in files.items():
                put(node, path, text, "755" if path.endswith("/glm-flash") else "644")
            assert ssh(node, f"rm -f {DROPIN}; systemctl daemon-reload").returncode == 0
        before = [closure_of(n, t) for n, t in zip(nodes, tools)]
        # The same commit of the repo: one closure, though each file carries its worker's own address.
        assert before[0] == before[1], before
        # A hand edit on the second worker: a drop-in, as `systemctl edit` writes.
        put(nodes[1], DROPIN, "[Service]\nEnvironment=HAND_EDIT=1\n")
        assert ssh(nodes[1], "systemctl daemon-reload").returncode == 0
        after = closure_of(nodes[1], tools[1])
        assert after["closure"] != before[1]["closure"]
        assert [k for k in after["parts"] if after["parts"][k] != before[1]["parts"][k]] == ["unit"]
        assert closure_of(nodes[0], tools[0]) == before[0]
        hosts = {
            workers[0][0]: {"closure": before[0]["closure"], "closure_parts": before[0]["parts"]},
            workers[1][0]: {"closure": after["closure"], "closure_parts": after["parts"]},
            "third": {"closure": before[0]["closure"], "closure_parts": before[0]["parts"]},
        }
        lines = closures(hosts)
        print("\n".join(lines))
        assert f"{workers[1][0]} drifted from {before[0]['closure']} in: unit" in lines
