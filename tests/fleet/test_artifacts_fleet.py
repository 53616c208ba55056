"""Artifacts cross the control machine's link once and the checkpoint the outside link once
(roles/fleet/artifacts.py, roles/model.py), on the fleet sandbox.

tests/fleet/deploy_artifacts.py runs only the transfer steps, with the gateway's 25 wheels
(36 MB) as the artifacts (the engine's 5 GB would not fit three times here): the seed worker
(node2) gets them from the control machine, the others from it over the local network. The
checkpoint is the single sandbox's stand-in (simulated hub, sandbox/fake_hub.py, which logs every
request to .sandbox/fleet/hub.log): the seed downloads it, the others receive it from the seed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.fleet.conftest import boot, env

DIR = "/opt/glm-flash/fleet-test/wheelhouse"
CHECKPOINT = "/srv/models/GLM-5.3-Flash"  # inventory/fleet_sandbox.py
HUB_LOG = REPO / ".sandbox" / "fleet" / "hub.log"  # the fleet's own stand-in hub (sandbox/fleet.py)
pytestmark = pytest.mark.sandbox


def deploy() -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pyinfra",
            "-y",
            "inventory/fleet_sandbox.py",
            "tests/fleet/deploy_artifacts.py",
            "--limit",
            "workers",
        ],
        cwd=REPO,
        env=env(),
        capture_output=True,
        text=True,
        timeout=900,
    )


def ssh(node: str, command: str) -> str:
    r = subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/fleet/ssh_config"), node, command],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def manifest(node: str) -> dict[str, str]:
    lines = ssh(node, "cat /opt/glm-flash/fleet/artifacts.txt").splitlines()
    return {rel.rsplit("/", 1)[1]: sha for sha, _, _, rel in (line.split() for line in lines)}


def hub_requests() -> list[dict]:
    return [json.loads(line) for line in HUB_LOG.read_text().splitlines()] if HUB_LOG.exists() else []


def checkpoint(node: str) -> dict:
    """The checkpoint's state as the model role checks it, its files' sha256 and owners."""
    check = ssh(node, f"python3 /opt/glm-flash/bin/glm-flash-model-fetch check --dest {CHECKPOINT} || true")
    # Not our marker (it says where and when this worker verified its copy).
    files = ssh(
        node,
        f"cd {CHECKPOINT} && find . -type f ! -path './.cache/*' ! -name .glm-flash-model.json | sort | xargs sha256sum",
    )
    owners = ssh(node, f"find {CHECKPOINT} ! -user root | head -n 3")
    return {"check": json.loads(check), "files": files, "not_root": owners.strip()}


def sums(node: str) -> dict[str, str]:
    out = ssh(node, f"cd {DIR} 2>/dev/null && sha256sum -- * || true")
    return {name: sha for sha, name in (line.split() for line in out.splitlines())}


def test_workers_get_the_artifacts_once_from_outside_and_from_the_seed(fleet_up):
    workers = [n["name"] for n in fleet_up[1:]]
    for node in workers:
        ssh(node, f"rm -rf {DIR} {CHECKPOINT}")
    hub_before = len(hub_requests())
    run = deploy()
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    want = manifest(workers[0])
    assert len(want) == 25
    seed = checkpoint(workers[0])
    assert seed["check"]["state"] == "complete" and seed["check"]["sealed"], seed
    for node in workers:
        assert sums(node) == want, node
        # Downloaded by the seed only, received by the others: the same verified files, sealed root's.
        got = checkpoint(node)
        assert got["files"] == seed["files"] and got["check"]["state"] == "complete", (node, got)
        assert got["check"]["sealed"] and not got["not_root"], (node, got)
    # The hub saw one request per checkpoint file, not one per worker.
    downloads = [r["path"] for r in hub_requests()[hub_before:] if r["method"] == "GET" and "/resolve/" in r["path"]]
    assert downloads and len(downloads) == len(set(downloads)), downloads
    assert len(downloads) == len(seed["files"].splitlines())
    # Uploads from the control machine went to the seed only; the seed served the rest.
    out = run.stdout + run.stderr
    uploads = [line for line in out.splitlines() if "Starting operation: From the control machine:" in line]
    assert len(uploads) == 25, out[-3000:]
    assert out.count(f"[{workers[0]}] Success") >= 25 and f"[{workers[1]}] Success" in out
    sent = ssh(
        workers[0], "journalctl -u 'glm-flash-peer-serve-artifacts-*' -o cat --no-pager | grep -F sent | tail -n 1"
    )
    size = int(ssh(workers[0], f"du -sb {DIR}").split()[0])
    # Every copy came from the seed (the only holder of fresh files); what aria2 dropped of a
    # connection it closed counts too (up to a few percent).
    n = int(sent.split()[2])
    assert size * (len(workers) - 1) <= n <= size * (len(workers) - 1) * 1.1, (n, size)
    # Complete everywhere: a second run moves nothing, asks the hub nothing and changes nothing.
    hub_before = len(hub_requests())
    again = deploy()
    again_out = again.stdout + again.stderr
    assert again.returncode == 0 and "Serve the" not in again_out
    assert hub_requests()[hub_before:] == []
    totals = [line for line in again_out.splitlines() if "Grand total" in line][0].split()
    assert totals[-3:] == ["-", "-", totals[-4]], again_out[-2000:]


def test_a_file_the_seed_sends_wrong_is_refused_and_not_kept(fleet_up):
    seed, peer, *others = [n["name"] for n in fleet_up[1:]]
    deploy()
    name = "idna-3.20-py3-none-any.whl"
    # Only the seed holds it (every worker that holds a file serves it; a right copy elsewhere
    # would be taken instead), with the right size and the wrong bytes (a hostile or broken peer).
    for other in others:
        ssh(other, f"rm -f {DIR}/{name}")
    ssh(
        seed,
        f"cd {DIR} && python3 -c \"import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); "
        f"b[100]^=0xff; open(p,'wb').write(b)\" {name}",
    )
    ssh(peer, f"rm -f {DIR}/{name}")
    run = deploy()
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"fleet-test/wheelhouse/{name}: sha256" in out and "is not the manifest's" in out
    assert name not in sums(peer)
    assert not ssh(peer, f"ls -A {DIR} | grep -F peer-partial || true").strip()
    # Removed on the seed, it comes again from the control machine, and from the seed to the peer.
    ssh(seed, f"rm -f {DIR}/{name}")
    assert deploy().returncode == 0
    assert sums(peer)[name] == manifest(peer)[name] == sums(seed)[name]


def test_a_poisoned_seed_is_refused_naming_the_file_and_nothing_is_sealed(fleet_up):
    """#36 H2: a seed (root on it) alters a shard and rewrites its own marker to match. The control
    machine holds the seed's marker against the hub's file list at the locked commit before any
    receiver gets it: the run names the file, the receiver gets nothing and seals nothing."""
    seed, peer = [n["name"] for n in fleet_up[1:3]]
    assert deploy().returncode == 0
    shard = ssh(seed, f"cd {CHECKPOINT} && ls *.safetensors | head -n 1").strip()
    ssh(
        seed,
        f"cd {CHECKPOINT} && python3 -c \"import hashlib, json, sys; p = sys.argv[1]; "
        "b = bytearray(open(p, 'rb').read()); b[-1] ^= 0xff; open(p, 'wb').write(b); "
        "m = json.load(open('.glm-flash-model.json')); m['files'][p]['sha256'] = hashlib.sha256(b).hexdigest(); "
        f"json.dump(m, open('.glm-flash-model.json', 'w'))\" {shard}",
    )
    assert checkpoint(seed)["check"]["state"] == "complete"  # its own check trusts its own marker
    ssh(peer, f"rm -rf {CHECKPOINT}")
    run = deploy()
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"{shard}: the seed's sha256 is not the hub's" in out, out[-3000:]
    # nothing received, nothing sealed (the directory is absent, or empty when the receive began)
    assert ssh(peer, f"ls -A {CHECKPOINT} 2>/dev/null || true").strip() == ""
    # The seed's poisoned copy removed, the next run takes the checkpoint from the hub's own files.
    ssh(seed, f"rm -rf {CHECKPOINT}")
    again = deploy()
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert checkpoint(peer)["check"]["state"] == "complete"
    assert checkpoint(peer)["files"] == checkpoint(seed)["files"]


def test_an_unreachable_worker_stops_no_other_and_catches_up_later(fleet_up):
    seed, peer = [n["name"] for n in fleet_up[1:3]]
    subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/fleet/ssh_config"), peer, "systemctl poweroff"], capture_output=True
    )
    ssh(seed, f"rm -rf {DIR}")
    run = deploy()
    out = run.stdout + run.stderr
    assert run.returncode != 0 and f"[{peer}] Could not connect" in out, out[-2000:]
    assert sums(seed) == manifest(seed), "the reachable worker did not converge"
    # Back up: it takes what it lacks from the seed.
    boot(len(fleet_up))
    ssh(peer, f"rm -rf {DIR}")
    run = deploy()
    assert run.returncode == 0, (run.stdout + run.stderr)[-2000:]
    assert sums(peer) == manifest(peer)


def test_a_hostile_holder_gets_no_root_fetch_no_netrc_and_nothing_kept(fleet_up):
    """#36 M2: the fetch from a peer runs as a unit of its own dynamic user, not as root in the SSH
    session. A holder that redirects every file elsewhere (aria2 follows redirects and cannot be told
    not to) gets: a fetch whose stage belongs to a dynamic user without capabilities, root's .netrc
    never sent, the redirect target's bytes never kept. The redirect itself is bounded by the unit's
    IPAddressAllow= (the sources only), which a container may not enforce (cgroup BPF): the test says
    which one held."""
    import hashlib
    import http.server
    import ipaddress
    import secrets
    import threading

    from roles.fleet.artifacts import FETCH_UNIT, fetching

    deploy()  # aria2 and glm-flash-peer on the workers
    receiver = fleet_up[2]
    # the fleet's own /24 on loopback (sandbox/fleet.py subnet()), read off a node's address: importing
    # sandbox.fleet here would find the repo's sandbox package where it wants sandbox/sandbox.py
    subnet = receiver["address"].rsplit(".", 1)[0]
    hostile_ip, target_ip = f"{subnet}.200", f"{subnet}.201"
    seen, reached = [], []

    class Target(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            reached.append((self.path, self.headers.get("Authorization")))
            body = b"x" * 1000  # not the manifest's bytes
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    class Hostile(Target):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/.have":
                body = b"redirect/x.bin\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(302)
            self.send_header("Location", f"http://{target_ip}:{target.server_address[1]}/stolen")
            self.send_header("Content-Length", "0")
            self.end_headers()

    target = http.server.ThreadingHTTPServer((target_ip, 0), Target)
    hostile = http.server.ThreadingHTTPServer((hostile_ip, 30080), Hostile)
    for srv in (target, hostile):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    data = b"the real bytes" * 100
    base, token_file, token = "/opt/glm-flash/fleet-test/redirect", "/opt/glm-flash/fleet/tokens/redirect.token", ""
    token = secrets.token_urlsafe(32)
    ssh(
        receiver["name"],
        f"rm -rf {base} /var/lib/private/{FETCH_UNIT}-redirect && install -d -m 755 {base}/root && "
        f"echo '{hashlib.sha256(data).hexdigest()} {len(data)} 644 redirect/x.bin' > {base}/m.txt && "
        f"install -d -m 700 /opt/glm-flash/fleet/tokens && (umask 077; echo {token} > {token_file}) && "
        f"printf 'machine {hostile_ip} login root password netrc-secret\\n' > /root/.netrc && chmod 600 /root/.netrc",
    )

    def host(address):
        return type(
            "Host", (), {"name": address, "data": type("D", (), {"dict": lambda self: {"fleet_address": address}})()}
        )()

    (command,) = fetching(
        "/opt/glm-flash/bin/glm-flash-peer",
        f"{base}/root",
        f"{base}/m.txt",
        [host(hostile_ip)],
        host(receiver["address"]),
        token_file,
        "redirect",
        len(data),
    )
    try:
        r = subprocess.run(
            ["ssh", "-F", str(REPO / ".sandbox/fleet/ssh_config"), receiver["name"], command],
            capture_output=True,
            text=True,
            timeout=600,
        )
        out = r.stdout + r.stderr
        owner = ssh(receiver["name"], f"stat -c %u /var/lib/private/{FETCH_UNIT}-redirect").strip()
        kept = ssh(receiver["name"], f"find {base}/root -type f").strip()
    finally:
        hostile.shutdown()
        target.shutdown()
        ssh(receiver["name"], f"rm -rf {base} /root/.netrc {token_file}")
    assert r.returncode != 0, out[-3000:]
    assert ("/.have", f"Bearer {token}") in seen and any(p == "/redirect/x.bin" for p, _ in seen), seen
    assert all("netrc-secret" not in (a or "") and not (a or "").startswith("Basic") for _, a in seen + reached)
    assert owner != "0" and int(owner) >= 61184, owner  # systemd's dynamic users: 61184-65519
    assert "redirect/x.bin" in out and "adopted 0 files" in out, out[-3000:]
    assert not kept, kept
    assert ipaddress.ip_address(target_ip).is_loopback
    print(f"redirect target reached {len(reached)} times: IPAddressAllow= {'not ' if reached else ''}enforced here")
