"""make bench URL=http://HOST:PORT [SUITE=l40s|gb10|quick|file.json] [MODEL=] [OUT=]
   make bench INVENTORY=inventory/l40s.py [BENCH_HOST=name]

The API key is read from the environment (GLM_FLASH_API_KEY), never from the command line.
Bad input or an unusable server ends with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from pathlib import Path

from benchmark import plots, report, suites
from benchmark.client import BenchError, Endpoint, served_model
from benchmark.endpoint import from_inventory, from_url
from benchmark.runner import Runner, log

REPO = Path(__file__).resolve().parent.parent


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", help="OpenAI-compatible base URL, http://HOST:PORT")
    ap.add_argument("--inventory", help="take the endpoint from this inventory's host and profile")
    ap.add_argument("--host", default=os.environ.get("BENCH_HOST"), help="which host of the inventory")
    ap.add_argument("--suite", help="l40s, gb10, quick or a .json file (default: the node's platform, else l40s)")
    ap.add_argument("--platform", choices=("l40s", "gb10"), help="whose field numbers quick compares with")
    ap.add_argument("--model", help="model name to send (default: what /v1/models lists first)")
    ap.add_argument("--out", help="output folder (default bench/<host>-<UTC time>/)")
    ap.add_argument("--api-key-env", default="GLM_FLASH_API_KEY", help="name of the variable holding the key")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    if a.url and a.inventory:
        raise BenchError("give URL or INVENTORY, not both")
    if not a.url and not a.inventory:
        raise BenchError("no endpoint: make bench URL=http://HOST:PORT (or INVENTORY=inventory/<node>.py)")
    target = from_url(a.url) if a.url else from_inventory(a.inventory, a.host, REPO)
    platform = a.platform or target.platform or (a.suite if a.suite in ("l40s", "gb10") else "l40s")
    suite = a.suite or target.platform or "l40s"
    try:
        scenarios = suites.load(suite, platform)
    except ValueError as e:
        raise BenchError(str(e)) from None
    key = os.environ.get(a.api_key_env) or None
    try:
        listed = served_model(target.url, key)
    except BenchError as e:
        raise BenchError(str(e) + (target.hint if "cannot reach" in str(e) else "")) from None
    model = a.model or listed or target.model
    if not model:
        raise BenchError(f"{target.url}/v1/models lists no model: pass MODEL=<name>")
    started = datetime.datetime.now(datetime.UTC)
    out = Path(a.out) if a.out else REPO / "bench" / f"{target.host}-{started:%Y%m%dT%H%M%SZ}"
    out.mkdir(parents=True, exist_ok=True)
    log(f"{target.url}, model {model}, suite {suite}: {len(scenarios)} scenarios, output in {out}")

    runner = Runner(Endpoint(target.url, key, model), scenarios)
    calibration = runner.prepare()
    results = [runner.scenario(sc, i, len(scenarios)) for i, sc in enumerate(scenarios, 1)]
    report.attach_refs(results, scenarios)
    meta = {
        "url": target.url,
        "host": target.host,
        "model": model,
        "suite": suite,
        "platform": platform,
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "calibration": calibration,
    }
    report.write_json(out, meta, results)
    title = f"{target.host}, suite {Path(suite).stem}"
    pngs = [
        str(plots.decode(results, out / "decode.png", title)),
        str(plots.prefill(results, out / "prefill.png", title)),
    ]
    report.write_markdown(out, meta, results, pngs)
    failed = sum(r["requests_failed"] for r in results)
    log(f"done: {out / 'report.md'}" + (f" ({failed} requests failed, counted in the report)" if failed else ""))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        sys.exit(130)
