"""make bench-fleet: bytes a fleet's artifacts cost on the outside link and on the control
machine's link, one worker against all the fleet sandbox's workers (`make fleet-up N=4` first: three).

The artifacts are those of tests/fleet/deploy_artifacts.py (the gateway's 25 wheels, 36 MB: the
engine's 5 GB would not fit on every worker here) and the checkpoint (the model role against the
stand-in hub: a small stand-in, not 306 GiB, so its count is per file and per request, not
its size's); the steps are roles/fleet/artifacts.py, roles/fleet/checkpoint.py and roles/model.py, as in deploy_fleet.py.
For each fleet size the workers' copies are removed, then the steps run:

- control link: bytes the deploy process (pyinfra) sent and received over SSH to every host
  (commands, facts, uploads; counted in paramiko's packetizer, encrypted as on the wire);
- local network: bytes the workers' peer servers sent (glm-flash-peer's own count), in all and
  per source: every worker holding a verified file serves it, and receivers take pieces from all
  holders (aria2), so no source sends N-1 copies (issue 22);
- time: the transfer steps' wall time for N workers over one worker's;
- outside: bytes the stand-in hub sent (.sandbox/hub.log) plus the files the control machine
  fetched into its download cache during the run (its "fetching" lines; 0 once cached: it
  fetches each file once, whatever the fleet's size). Not the cache's growth: other checkouts
  share the cache.

Goal (issue 14): a fleet's control-link bytes <= 1.2x one host's; outside bytes <= 1.1x.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FLEET = REPO / ".sandbox" / "fleet"
DIR = "/opt/glm-flash/fleet-test/wheelhouse"
CHECKPOINT = "/srv/models/GLM-5.3-Flash"  # inventory/fleet_sandbox.py
HUB_LOG = REPO / ".sandbox" / "hub.log"
# Runs pyinfra, counting every byte its SSH connections (paramiko) send and receive.
WRAP = (
    "import atexit, json, runpy, sys\n"
    "import paramiko.packet as pk\n"
    "out, n = sys.argv.pop(1), {'sent': 0, 'received': 0}\n"
    "w, r = pk.Packetizer.write_all, pk.Packetizer.read_all\n"
    "def write_all(self, data):\n    n['sent'] += len(data); return w(self, data)\n"
    "def read_all(self, size, check_rekey=False):\n"
    "    data = r(self, size, check_rekey); n['received'] += len(data); return data\n"
    "pk.Packetizer.write_all, pk.Packetizer.read_all = write_all, read_all\n"
    "atexit.register(lambda: open(out, 'w').write(json.dumps(n)))\n"
    "sys.argv[0] = 'pyinfra'\n"
    "runpy.run_module('pyinfra', run_name='__main__')\n"
)


def ssh(node: str, command: str) -> str:
    r = subprocess.run(
        ["ssh", "-F", str(FLEET / "ssh_config"), node, command], capture_output=True, text=True, timeout=120
    )
    if r.returncode:
        sys.exit(f"bench-fleet: {node}: {command}: {r.stderr.strip()}")
    return r.stdout


def fetched_bytes(output: str) -> int:
    """Bytes of the files this run fetched into the control machine's cache (its "fetching" lines)."""
    from control.pypi_cache import cache_root

    names = {line.split("fetching ", 1)[1].strip() for line in output.splitlines() if "glm-flash: fetching " in line}
    return sum(next(cache_root().rglob(n)).stat().st_size for n in names if any(cache_root().rglob(n)))


def hub_bytes() -> int:
    lines = HUB_LOG.read_text().splitlines() if HUB_LOG.exists() else []
    return sum(json.loads(line).get("bytes", 0) for line in lines)


def run(workers: list[str], fresh: list[str] | None = None) -> dict:
    """The transfer steps on `workers`, after removing the copies of `fresh` (all by default)."""
    for node in workers if fresh is None else fresh:
        ssh(node, f"rm -rf {DIR} {CHECKPOINT}")
    since = ssh(workers[0], "date +%s").strip()
    hub_before = hub_bytes()
    with tempfile.NamedTemporaryFile("r", suffix=".io") as io:
        env = dict(os.environ, GLM_FLASH_FLEET_WORKERS=str(len(workers)))
        cmd = [sys.executable, "-c", WRAP, io.name, "-y", "inventory/fleet_sandbox.py"]
        started = time.monotonic()
        r = subprocess.run(
            [*cmd, "tests/fleet/deploy_artifacts.py", "--limit", "workers"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        if r.returncode:
            sys.exit(f"bench-fleet: the deploy failed:\n{(r.stdout + r.stderr)[-3000:]}")
        seconds = time.monotonic() - started
        counters = json.loads(io.read())
    per_source = {}
    for node in workers:
        n = 0
        for unit in ("artifacts", "glm-flash-model-download"):
            sent = ssh(
                node,
                f"journalctl -u 'glm-flash-peer-serve-{unit}-*' --since @{since} -o cat --no-pager "
                "| grep -F 'sent ' | tail -n 1 || true",
            )
            n += int(sent.split()[2]) if sent.startswith("glm-flash-peer: sent") else 0
        per_source[node] = n
    local = sum(per_source.values())
    size = int(ssh(workers[0], f"du -sb {DIR} {CHECKPOINT} | awk '{{n += $1}} END {{print n}}'").strip())
    return {
        "workers": len(workers),
        "artifact_bytes": size,
        "control_link_bytes": counters["sent"] + counters["received"],
        "local_network_bytes": local,
        "sent_by": per_source,
        "seconds": round(seconds, 1),
        "hub_bytes": hub_bytes() - hub_before,
        "outside_bytes": fetched_bytes(r.stdout + r.stderr) + hub_bytes() - hub_before,
    }


def main() -> None:
    sys.path.insert(0, str(REPO))
    nodes_file = FLEET / "nodes.json"
    if not nodes_file.exists():
        sys.exit("bench-fleet: the fleet sandbox is not up. Fix: make fleet-up N=3")
    workers = [n["name"] for n in json.loads(nodes_file.read_text())[1:]]
    if len(workers) < 2:
        sys.exit("bench-fleet: needs at least two workers. Fix: make fleet-up N=3")
    one, many = run(workers[:1]), run(workers)
    ratio = many["control_link_bytes"] / one["control_link_bytes"]
    out_ratio = (many["outside_bytes"] + 1) / (one["outside_bytes"] + 1)
    print(
        f"{'workers':>8} {'artifacts+ckpt':>14} {'control link':>14} {'local network':>14} {'hub':>8} {'outside':>10}"
    )
    for r in (one, many):
        print(
            f"{r['workers']:>8} {r['artifact_bytes']:>14} {r['control_link_bytes']:>14} "
            f"{r['local_network_bytes']:>14} {r['hub_bytes']:>8} {r['outside_bytes']:>10}"
        )
    print(
        f"control link: {ratio:.2f}x one host's (goal <= 1.2x; one upload per worker would be "
        f"~{len(workers)}x); outside: {out_ratio:.2f}x (goal <= 1.1x)"
    )
    copies = {n: b / many["artifact_bytes"] for n, b in many["sent_by"].items()}
    print("sent by each source: " + ", ".join(f"{n} {b} ({copies[n]:.2f} copies)" for n, b in many["sent_by"].items()))
    time_ratio = many["seconds"] / one["seconds"]
    print(f"time: {many['seconds']} s for {len(workers)} workers, {one['seconds']} s for one: {time_ratio:.2f}x")
    # A worker joining a deployed fleet: the others hold everything and share the sending.
    grow = run(workers, fresh=workers[-1:])
    print(
        f"a worker added to {len(workers) - 1}: sent by each source: "
        + ", ".join(f"{n} {b}" for n, b in grow["sent_by"].items())
        + f"; {grow['seconds']} s; control link {grow['control_link_bytes']}, hub {grow['hub_bytes']}"
    )
    result = {"one": one, "fleet": many, "grow": grow, "control_link_ratio": ratio, "time_ratio": time_ratio}
    (FLEET / "bench.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
