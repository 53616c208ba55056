"""Write dashboards/glm-flash.json, the Grafana dashboard of a node and a fleet (`make dashboard`).

Panels are named for what the field reports measured (docs/sources.md §1): decode tok/s per
stream and in total, prefill tok/s, time to first token, queue length, KV-cache use, the GB10's
spec-decode acceptance, GPU memory per card, the unified-memory box's host memory. Each panel
queries both engines (sglang:* on the L40S, vllm:* on the GB10): the one a node does not run
returns nothing. Every metric a query names is one the sandbox's scrape returned or one the
engine documents (tests/unit/test_observability.py lists them with their source).

Grafana's dashboard model: https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "dashboards" / "glm-flash.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'instance=~"$instance"'


def per_stream(engine: str) -> str:
    """Decode tok/s of one stream: 1 / mean time between output tokens."""
    m = f"{engine}:inter_token_latency_seconds"
    return f"1 / (sum by (instance) (rate({m}_sum{{{SEL}}}[1m])) / sum by (instance) (rate({m}_count{{{SEL}}}[1m])))"


def rate_sum(metric: str, window: str = "1m") -> str:
    return f"sum by (instance) (rate({metric}{{{SEL}}}[{window}]))"


def quantile(q: float, metric: str) -> str:
    return f"histogram_quantile({q}, sum by (instance, le) (rate({metric}_bucket{{{SEL}}}[5m])))"


# (title, unit, [(legend, expr)], description)
PANELS = [
    (
        "Decode tok/s per stream",
        "none",
        [
            ("{{instance}} sglang", per_stream("sglang")),
            ("{{instance}} vllm", per_stream("vllm")),
        ],
        "1 / mean inter-token latency: what one user sees (field report: L40S ~24 tok/s at n=1)",
    ),
    (
        "Decode tok/s total",
        "none",
        [
            ("{{instance}} sglang", rate_sum("sglang:generation_tokens_total")),
            ("{{instance}} vllm", rate_sum("vllm:generation_tokens_total")),
        ],
        "output tokens per second over all streams",
    ),
    (
        "Prefill tok/s",
        "none",
        [
            ("{{instance}} sglang", rate_sum("sglang:prompt_tokens_total")),
            ("{{instance}} vllm", rate_sum("vllm:prompt_tokens_total")),
        ],
        "prompt tokens processed per second",
    ),
    (
        "Time to first token (p50, p95)",
        "s",
        [
            ("{{instance}} sglang p50", quantile(0.5, "sglang:time_to_first_token_seconds")),
            ("{{instance}} sglang p95", quantile(0.95, "sglang:time_to_first_token_seconds")),
            ("{{instance}} vllm p50", quantile(0.5, "vllm:time_to_first_token_seconds")),
            ("{{instance}} vllm p95", quantile(0.95, "vllm:time_to_first_token_seconds")),
        ],
        "from the request's arrival to its first output token",
    ),
    (
        "Queue length (waiting and running requests)",
        "none",
        [
            ("{{instance}} sglang waiting", f"sglang:num_queue_reqs{{{SEL}}}"),
            ("{{instance}} sglang running", f"sglang:num_running_reqs{{{SEL}}}"),
            ("{{instance}} vllm waiting", f"vllm:num_requests_waiting{{{SEL}}}"),
            ("{{instance}} vllm running", f"vllm:num_requests_running{{{SEL}}}"),
        ],
        "requests waiting for a slot, and in flight (max_mamba_cache_size / max_num_seqs)",
    ),
    (
        "KV-cache use",
        "percentunit",
        [
            ("{{instance}} sglang", f"sglang:token_usage{{{SEL}}}"),
            ("{{instance}} vllm", f"vllm:kv_cache_usage_perc{{{SEL}}}"),
        ],
        "share of the KV pool in use (1 = full)",
    ),
    (
        "Spec-decode acceptance length (GB10, DFlash2)",
        "none",
        [
            (
                "{{instance}}",
                f"1 + {rate_sum('vllm:spec_decode_num_accepted_tokens_total', '5m')} / "
                f"{rate_sum('vllm:spec_decode_num_drafts_total', '5m')}",
            ),
            ("{{instance}} sglang", f"sglang:spec_accept_length{{{SEL}}}"),
        ],
        "tokens per verification step (field report: 5.5 on code at k=7)",
    ),
    (
        "GPU memory per card",
        "bytes",
        [
            ("{{instance}} GPU {{gpu}} used", f"glm_flash_gpu_memory_used_bytes{{{SEL}}}"),
            ("{{instance}} GPU {{gpu}} total", f"glm_flash_gpu_memory_total_bytes{{{SEL}}}"),
        ],
        "nvidia-smi memory.used per GPU (the GB10's unified memory has no total of its own: see host memory)",
    ),
    (
        "GPU utilisation",
        "percentunit",
        [
            ("{{instance}} GPU {{gpu}}", f"glm_flash_gpu_utilization_ratio{{{SEL}}}"),
        ],
        "nvidia-smi utilization.gpu",
    ),
    (
        "GPU temperature and power",
        "none",
        [
            ("{{instance}} GPU {{gpu}} °C", f"glm_flash_gpu_temperature_celsius{{{SEL}}}"),
            ("{{instance}} GPU {{gpu}} W", f"glm_flash_gpu_power_watts{{{SEL}}}"),
        ],
        "nvidia-smi temperature.gpu and power.draw",
    ),
    (
        "GPU clocks",
        "hertz",
        [
            ("{{instance}} GPU {{gpu}} SM", f"glm_flash_gpu_sm_clock_hertz{{{SEL}}}"),
            ("{{instance}} GPU {{gpu}} memory", f"glm_flash_gpu_memory_clock_hertz{{{SEL}}}"),
        ],
        "nvidia-smi clocks.sm and clocks.mem",
    ),
    (
        "GPU errors (ECC, Xid) and collector",
        "none",
        [
            ("{{instance}} GPU {{gpu}} ECC corrected", f"glm_flash_gpu_ecc_corrected_errors{{{SEL}}}"),
            ("{{instance}} GPU {{gpu}} ECC uncorrected", f"glm_flash_gpu_ecc_uncorrected_errors{{{SEL}}}"),
            ("{{instance}} Xid errors since boot", f"glm_flash_gpu_xid_errors{{{SEL}}}"),
            ("{{instance}} collector up (0: the driver does not answer)", f"glm_flash_gpu_collector_up{{{SEL}}}"),
            ("{{instance}} GPUs present (0: none, n/a)", f"glm_flash_gpu_present{{{SEL}}}"),
        ],
        "collector up 0 with GPUs present: nvidia-smi fails (journalctl -u glm-flash-gpu-metrics)",
    ),
    (
        "Host memory (unified on the GB10: the GPU allocates from it)",
        "bytes",
        [
            ("{{instance}} available", f"node_memory_MemAvailable_bytes{{{SEL}}}"),
            ("{{instance}} total", f"node_memory_MemTotal_bytes{{{SEL}}}"),
        ],
        "MemAvailable is what the memory guard (earlyoom) watches on the GB10",
    ),
    (
        "Host CPU busy",
        "percentunit",
        [
            ("{{instance}}", f'1 - avg by (instance) (rate(node_cpu_seconds_total{{mode="idle",{SEL}}}[1m]))'),
        ],
        "the L40S box's CPU experts (KTransformers) run here",
    ),
    (
        "Gateway requests/s",
        "reqps",
        [
            ("{{instance}}", 'sum by (instance) (rate(smg_http_requests_total{job="glm-flash-gateway"}[1m]))'),
        ],
        "the fleet's router: requests it received",
    ),
    (
        "Gateway workers in the pool",
        "none",
        [
            ("{{instance}}", 'smg_worker_pool_size{job="glm-flash-gateway"}'),
        ],
        "workers the router routes to (a dead worker leaves after gateway_health_failures checks)",
    ),
]


def panel(i: int, title: str, unit: str, queries: list[tuple[str, str]], description: str) -> dict:
    return {
        "id": i + 1,
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
        "targets": [
            {"refId": chr(ord("A") + j), "datasource": DS, "expr": expr, "legendFormat": legend}
            for j, (legend, expr) in enumerate(queries)
        ],
    }


def dashboard() -> dict:
    return {
        "uid": "glm-flash-node",
        "title": "GLM-5.3-Flash node",
        "description": "A glm-flash node or fleet: engine, GPUs, host, gateway (dashboards/glm-flash.json, scripts/dashboard.py)",
        "tags": ["glm-flash"],
        "timezone": "utc",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
                {
                    "name": "instance",
                    "type": "query",
                    "datasource": DS,
                    "query": "label_values(up, instance)",
                    "includeAll": True,
                    "multi": True,
                    "current": {"text": "All", "value": "$__all"},
                    "label": "Host",
                },
            ]
        },
        "annotations": {"list": []},
        "panels": [panel(i, *p) for i, p in enumerate(PANELS)],
    }


def render() -> str:
    return json.dumps(dashboard(), indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
