"""`make bench INVENTORY=...`: the endpoint is the inventory host's address and its profile's port."""

from __future__ import annotations

import json
import os
import subprocess

from tests.bench.conftest import KEY, REPO
from tests.bench.fake_openai import FakeOpenAI

SUITE = {"scenarios": [{"name": "decode-1", "kind": "decode", "max_tokens": 20, "runs": 1}]}


def write_inventory(path, host: str, data: dict) -> str:
    path.write_text("from control.profile import hosts\n\n"
                    f"hosts = hosts(({host!r}, {data!r}),)\n")
    return str(path)


def make_bench(tmp_path, **variables) -> subprocess.CompletedProcess:
    suite = tmp_path / "suite.json"
    suite.write_text(json.dumps(SUITE))
    args = [f"{k}={v}" for k, v in dict(variables, SUITE=suite).items()]
    env = dict(os.environ, GLM_FLASH_API_KEY=KEY)
    return subprocess.run(["make", "-s", "bench", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)


def test_make_bench_takes_host_and_port_from_the_inventory(bench_venv, tmp_path):
    with FakeOpenAI(tok_s=300, ttft_s=0.02, api_key=KEY) as fake:
        port = int(fake.url.rsplit(":", 1)[1])
        inv = write_inventory(tmp_path / "node.py", "bench-node",
                              {"ssh_hostname": "127.0.0.1", "port": port, "require_gpu": False})
        done = make_bench(tmp_path, INVENTORY=inv, OUT=tmp_path / "out")
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["url"] == fake.url and results["platform"] == "l40s"
    assert fake.generations >= 2


def test_a_loopback_only_node_gets_a_tunnel_hint(bench_venv, tmp_path):
    inv = write_inventory(tmp_path / "node.py", "gpu1.invalid", {"require_gpu": False})
    done = make_bench(tmp_path, INVENTORY=inv)
    lines = [line for line in done.stderr.splitlines() if line.startswith("bench:")]
    assert done.returncode != 0 and len(lines) == 1 and "Traceback" not in done.stderr
    assert "cannot reach http://gpu1.invalid:30000" in lines[0] and "ssh -L 30000:127.0.0.1:30000" in lines[0]


def test_the_example_inventory_is_refused_before_connecting(bench_venv, tmp_path):
    done = make_bench(tmp_path, INVENTORY="inventory/l40s.py")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "placeholder" in done.stderr and "no host was changed" in done.stderr
