"""`make bench-deploy`: how long a converged re-run of deploy.py takes next to a one-fact pyinfra run.

    python benchmark/deploy_bench.py [--inventory inventory/sandbox.py] [--runs 3]

Run it against a deployed host (the sandbox: `make deploy` first). Each command runs --runs
times; the medians and their ratio are printed (target: the converged re-run costs at most 3x
the one-fact run). A re-run that changes anything is not converged: that is said too.
Not a test: it measures, it does not pass or fail on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = 3.0


def timed(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.monotonic()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    return time.monotonic() - start, r


def changed(result_json: str) -> list[str]:
    """Operations of a `pyinfra --json` run that changed (or failed) something."""
    ops = json.loads(result_json)["results"]["operations"]
    return [op["name"] for op in ops if op["success"] or op["error"]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inventory", default="inventory/sandbox.py")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fact", default="server.Hostname", help="the one fact the baseline run gathers")
    args = ap.parse_args(argv)
    pyinfra = [sys.executable, "-m", "pyinfra", "-y"]

    fact_times, deploy_times = [], []
    for i in range(args.runs):
        t, r = timed([*pyinfra, args.inventory, "fact", args.fact])
        if r.returncode != 0:
            print(f"bench-deploy: the fact run failed:\n{r.stderr[-3000:]}", file=sys.stderr)
            return 1
        fact_times.append(t)
        t, r = timed([*pyinfra, "--json", args.inventory, "deploy.py"])
        if r.returncode != 0:
            print(f"bench-deploy: the deploy failed:\n{r.stderr[-3000:]}", file=sys.stderr)
            return 1
        deploy_times.append(t)
        ops = changed(r.stdout)
        note = f", NOT converged: {len(ops)} operation(s) changed: {'; '.join(ops)[:300]}" if ops else ", zero changes"
        print(f"run {i + 1}: one fact {fact_times[-1]:.2f} s, converged deploy {t:.2f} s{note}", flush=True)

    fact, deploy = statistics.median(fact_times), statistics.median(deploy_times)
    ratio = deploy / fact
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"one-fact pyinfra run:   {fact:.2f} s (median of {args.runs})")
    print(f"converged deploy.py:    {deploy:.2f} s (median of {args.runs})")
    print(f"ratio:                  {ratio:.1f}x ({verdict} the target of <= {TARGET:g}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
