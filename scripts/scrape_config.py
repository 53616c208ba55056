"""A Prometheus scrape config for the hosts of an inventory: `make scrape-config INVENTORY=...`.

    python scripts/scrape_config.py inventory/fleet.py > prometheus.yml

Reads the inventory as pyinfra does (every module-level list of (name, data) is a group; the
inventory's own checks run first) and writes, on stdout, one job per kind of target:
- glm-flash-engine: each node's API address, /metrics (the engine's own; not behind the key);
- glm-flash-node: each node's prometheus-node-exporter (host metrics and the GPU collector's);
- glm-flash-gateway: the fleet gateway's router metrics (its --prometheus-port).
A node with `metrics: false` is left out of the exporter job; its engine's /metrics is still
there on vLLM (always on) and absent on SGLang-kt (no --enable-metrics). The address is the
one the node listens on, or its SSH address when it listens on every interface (as the
gateway's worker list does: control/fleet.py). YAML is written as JSON, which YAML reads.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from control.fleet import ANY, GATEWAY, gateway_profile  # noqa: E402
from control.profile import ProfileError, build  # noqa: E402

SCRAPE_INTERVAL = "15s"


def address(name: str, data: dict, listen: str, port: int) -> str:
    where = (data.get("ssh_hostname") or name) if listen in ANY else listen
    return f"[{where}]:{port}" if ":" in where else f"{where}:{port}"


def groups(module: dict) -> dict[str, list[tuple[str, dict]]]:
    out = {}
    for key, value in module.items():
        if key.startswith("_") or not isinstance(value, list):
            continue
        entries = [e for e in value if isinstance(e, tuple) and len(e) == 2 and isinstance(e[1], dict)]
        if entries and len(entries) == len(value):
            out[key] = entries
    return out


def config(module: dict) -> dict:
    engine, node, gateway = [], [], []
    for group, entries in groups(module).items():
        for name, data in entries:
            if group == GATEWAY:
                p = gateway_profile(name, data)
                gateway.append(address(name, data, p.gateway_listen_host, p.gateway_metrics_port))
                continue
            p = build(name, data, api_key_present=True)
            engine.append(address(name, data, p.listen_host, p.port))
            if p.metrics:
                node.append(address(name, data, p.listen_host, p.node_exporter_port))
    jobs = [
        ("glm-flash-engine", engine),
        ("glm-flash-node", node),
        ("glm-flash-gateway", gateway),
    ]
    return {
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "scrape_configs": [
            {
                "job_name": job,
                "metrics_path": "/metrics",
                # The engines' names have colons (sglang:..., vllm:...). Offered OpenMetrics, their
                # prometheus_client (0.26 in sglang-kt's lock) escapes them to underscores, and the
                # dashboard's queries find nothing (seen with Debian 13's Prometheus 2.53,
                # tests/sandbox/test_prometheus_scrape.py): ask for the text format, which keeps them.
                **({"scrape_protocols": ["PrometheusText0.0.4"]} if job == "glm-flash-engine" else {}),
                "static_configs": [{"targets": sorted(set(targets))}],
            }
            for job, targets in jobs
            if targets
        ],
    }


def main(inventory: str) -> int:
    try:
        module = runpy.run_path(inventory)
        print(json.dumps(config(module), indent=2))
    except ProfileError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "inventory/l40s.py"))
