"""`make bench-cold`: a cold deploy next to the checkpoint download alone, over the same slow link.

    python benchmark/cold_bench.py [--size-mib 3072] [--rate-mib 2] [--shards 6] [--keep]

The deploy starts the download in the background after the driver role and waits for it only
where the checkpoint is needed (#21 item 6), so on a box whose link is the bottleneck a cold
deploy should take little more than the download alone (target: at most 1.1x).

Simulated: the hub and the link. A stand-in hub (sandbox/fake_hub.py) on loopback serves a
checkpoint of --size-mib (the sandbox's config.json and index, shards of random bytes) with all
downloads sharing --rate-mib MiB/s, the shape of a real box's link to the hub (306 GiB at
100 MB/s is about 55 min, longer than its engine build). Everything else is the real deploy.

1. `sandbox/sandbox.py fresh` (a bare machine; the control machine's caches stay warm, as on a
   user's second box), then the deploy with hf_endpoint and model_revision pointed at that hub:
   timed from start to end.
2. On that deployed machine, the download alone: the same downloader, user and unit
   (roles/operations/checkpoint.py download_unit_text) into an empty scratch directory,
   timed. Then both times and their ratio are printed.
Not a test: it measures, it does not pass or fail on time. Pick --size-mib and --rate-mib so the
download takes longer than the rest of a cold sandbox deploy, as on a real box.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from control import layout  # noqa: E402
from roles import model  # noqa: E402
from roles.operations.checkpoint import download_unit_path, download_unit_text  # noqa: E402
from roles.operations.job import JOB_TOOL  # noqa: E402
from sandbox import fake_model  # noqa: E402
from sandbox.fake_hub import FakeHub, read_dir  # noqa: E402
from tests.conftest import SANDBOX_INVENTORY, inventory_hosts, sandbox_sh  # noqa: E402

TARGET = 1.1
SCRATCH = "/srv/glm-flash-bench-cold"


def stage(path: Path, size: int, shards: int) -> tuple[dict[str, bytes], str]:
    """The sandbox's stand-in checkpoint with `shards` shards of random bytes, `size` in all."""
    fake_model.write_model(path, shards=shards)
    for i in range(1, shards + 1):
        (path / f"model-{i:05d}-of-{shards:05d}.safetensors").write_bytes(os.urandom(size // shards))
    files = read_dir(path)
    digest = hashlib.sha1()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name])
    return files, digest.hexdigest()


def timed(cmd: list[str], log: Path) -> float:
    start = time.monotonic()
    with open(log, "w") as out:
        r = subprocess.run(
            cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1")
        )
    took = time.monotonic() - start
    if r.returncode != 0:
        sys.exit(f"bench-cold: {' '.join(cmd[:4])}... failed (exit {r.returncode}); its output: {log}")
    return took


def minutes(s: float) -> str:
    return f"{s / 60:.1f} min ({s:.0f} s)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=3072, help="the stand-in checkpoint's size")
    ap.add_argument("--rate-mib", type=float, default=2.0, help="MiB/s all downloads share")
    ap.add_argument("--shards", type=int, default=6)
    ap.add_argument("--alone-only", action="store_true", help="on the deployed sandbox: only the download alone")
    ap.add_argument("--out", type=Path, default=REPO / ".sandbox" / "bench-cold", help="the deploy's output goes here")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.alone_only:
        # the machine first: the inventory (the repo id below) reads what `fresh` writes under .sandbox
        print("bench-cold: a fresh sandbox (sandbox/sandbox.py fresh)", flush=True)
        subprocess.run([sys.executable, "sandbox/sandbox.py", "fresh"], cwd=REPO, check=True)
    files, commit = stage(a.out / "repo", a.size_mib << 20, a.shards)
    total = sum(len(b) for b in files.values())
    with FakeHub(model_repo_id(), files, commit=commit, rate=a.rate_mib * (1 << 20)) as hub:
        print(f"bench-cold: stand-in hub {hub.endpoint}: {total / (1 << 20):.0f} MiB at {a.rate_mib:g} MiB/s shared")
        if not a.alone_only:
            data = ["--data", f"hf_endpoint={hub.endpoint}", "--data", f"model_revision={commit}"]
            print(f"bench-cold: cold deploy (output: {a.out / 'deploy.log'})", flush=True)
            cold = timed(
                [sys.executable, "-m", "pyinfra", "-y", *data, SANDBOX_INVENTORY, "deploy.py"], a.out / "deploy.log"
            )
            served = sum(hub.served.values())
            print(f"bench-cold: cold deploy {minutes(cold)}; the hub served {served / (1 << 20):.0f} MiB", flush=True)
        alone = download_alone(hub, commit, files)
    print(f"download alone:  {minutes(alone)}")
    if a.alone_only:
        return 0
    ratio = cold / alone
    print(f"cold deploy:     {minutes(cold)}")
    verdict = "within" if ratio <= TARGET else "over"
    print(f"ratio:           {ratio:.2f} ({verdict} the {TARGET:g}x target)")
    return 0


def download_alone(hub: FakeHub, commit: str, files: dict[str, bytes]) -> float:
    """Seconds the deploy's downloader, user and unit take to fetch the checkpoint into an empty
    directory on the deployed sandbox; exits when it did not end with every file whole (a deploy
    to the same sandbox meanwhile stops the downloader's units, and the unit then ends cleanly)."""
    (name, hostdata), *_ = inventory_hosts(SANDBOX_INVENTORY)
    from control.profile import build

    profile = build(name, {**hostdata, "hf_endpoint": hub.endpoint}, api_key_present=False)
    unit = "glm-flash-bench-cold-download"
    tool = layout.tool(profile, model.FETCH)
    args = ["download", "--dest", SCRATCH, "--repo", model_repo_id(), "--revision", commit]
    python = f"{layout.hub_venv(profile)}/bin/python"
    text = download_unit_text(model.fetch_user(profile), [python, tool, *args], SCRATCH, hub.endpoint, None, "bench")
    unit_file = download_unit_path(unit)
    cmd = (
        f"printf %s {shlex.quote(text)} > {unit_file} && systemctl daemon-reload && systemctl start {unit} && "
        f"{layout.tool(profile, JOB_TOOL)} follow {unit}.service && "
        f"python3 {tool} check --dest {SCRATCH} --repo {model_repo_id()} --revision {commit}; "
        f"rc=$?; rm -f {unit_file}; systemctl daemon-reload; exit $rc"
    )
    q = shlex.quote(SCRATCH)
    sandbox_sh(f"rm -rf {q} && install -d -m 755 -o {shlex.quote(model.fetch_user(profile))} {q}")
    print("bench-cold: the download alone, same downloader and unit, into an empty directory", flush=True)
    start = time.monotonic()
    r = sandbox_sh(cmd, check=False, timeout=24 * 3600)
    alone = time.monotonic() - start
    sizes = sandbox_sh(f"cd {q} && stat -c '%s %n' " + " ".join(shlex.quote(n) for n in files), check=False).stdout
    got = {n: int(sz) for sz, n in (line.split(" ", 1) for line in sizes.splitlines())}
    sandbox_sh(f"rm -rf {q}")
    if r.returncode != 0:
        sys.exit(f"bench-cold: the download alone failed: {r.stdout}{r.stderr}")
    short = sorted(n for n, b in files.items() if got.get(n) != len(b))
    if short:
        sys.exit(f"bench-cold: the download alone ended without {short} whole (was it stopped? "
                 "a deploy to this sandbox stops the downloader's units): no figure")  # fmt: skip
    return alone


def model_repo_id() -> str:
    (_, hostdata), *_ = inventory_hosts(SANDBOX_INVENTORY)
    return hostdata["model_id"]


if __name__ == "__main__":
    sys.exit(main())
