"""`make bench-deploy`: how long a converged re-run of deploy.py takes next to a one-fact pyinfra run.

    python benchmark/deploy_bench.py [--inventory inventory/sandbox.py] [--runs 3] [--profile]

Run it against a deployed host (the sandbox: `make deploy` first). Each command runs --runs
times; the medians and their ratio are printed (target: the converged re-run costs at most 3x
the one-fact run). A re-run that changes anything is not converged: that is said too.
Not a test: it measures, it does not pass or fail on time.
--profile adds one converged run that times every command pyinfra sends (each fact is one SSH
round trip) and prints where the time went: the slowest commands and the facts by class.
"""

from __future__ import annotations

import argparse
import collections
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


def profiled_run(inventory: str, out: str) -> None:
    """In this process: a pyinfra run of deploy.py with every command and fact timed into `out`."""
    from pyinfra.api import facts
    from pyinfra.connectors.ssh import SSHConnector
    from pyinfra_cli.main import main as pyinfra_main

    rec: list = []
    run_command, get_fact = SSHConnector.run_shell_command, facts._get_fact

    def timed_command(self, command, *a, **kw):
        start = time.monotonic()
        try:
            return run_command(self, command, *a, **kw)
        finally:
            text = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
            rec.append(("command", " ".join(text.split())[:140], time.monotonic() - start))

    def timed_fact(state, host, cls, *a, **kw):
        start = time.monotonic()
        try:
            return get_fact(state, host, cls, *a, **kw)
        finally:
            rec.append(("fact", f"{cls.__module__}.{cls.__name__}", time.monotonic() - start))

    SSHConnector.run_shell_command, facts._get_fact = timed_command, timed_fact
    start = time.monotonic()
    try:
        sys.argv = ["pyinfra", "-y", inventory, "deploy.py"]
        pyinfra_main()
    except SystemExit:
        pass
    finally:
        Path(out).write_text(json.dumps({"total": time.monotonic() - start, "rec": rec}))


def print_profile(inventory: str) -> None:
    out = REPO / ".sandbox" / "deploy-profile.json"
    out.parent.mkdir(exist_ok=True)
    cmd = [sys.executable, __file__, "--profiled-run", str(out), "--inventory", inventory]
    subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    data = json.loads(out.read_text())
    commands = [r for r in data["rec"] if r[0] == "command"]
    print(
        f"\nprofile of one converged run: {data['total']:.1f} s, {len(commands)} commands (SSH round trips) "
        f"taking {sum(r[2] for r in commands):.1f} s"
    )
    print("slowest commands:")
    for _, text, t in sorted(commands, key=lambda r: -r[2])[:10]:
        print(f"  {t:6.2f} s  {text}")
    by_class: dict = collections.defaultdict(lambda: [0, 0.0])
    for kind, name, t in data["rec"]:
        if kind == "fact":
            by_class[name][0] += 1
            by_class[name][1] += t
    print("facts by class (count, time):")
    for name, (n, t) in sorted(by_class.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"  {n:4d} {t:6.2f} s  {name}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inventory", default="inventory/sandbox.py")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fact", default="server.Hostname", help="the one fact the baseline run gathers")
    ap.add_argument("--profile", action="store_true", help="also show where a converged run's time goes")
    ap.add_argument("--profiled-run", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.profiled_run:
        profiled_run(args.inventory, args.profiled_run)
        return 0
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
    if args.profile:
        print_profile(args.inventory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
