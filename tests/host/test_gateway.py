"""Host checks of a fleet's gateway (roles/fleet/gateway.py): run against the gateway host.

    pytest tests/host/test_gateway.py --no-deploy --inventory inventory/fleet.py --hosts ssh://root@gw.lan

On another host they are reported as not applicable. The API key is read on the host from the
root-only credential file, so it is never on a command line here either.
"""

from __future__ import annotations

import json
import os
import re
import runpy

import pytest

from control.fleet import GATEWAY, gateway_profile
from roles.fleet.gateway import CONF_DIR
from tests.conftest import REPO

UNIT = "glm-flash-gateway.service"
FRONT = "glm-flash-front.service"

# Runs on the gateway host with its python3: status codes of requests with and without the key, and
# the text of one completion with it (the key is read there, from the root-only file).
PROBE = r"""
import json, ssl, sys, urllib.request, urllib.error
base = sys.argv[1]
key = open("/etc/glm-flash-gateway/api-key").read().strip()
# Trusting the fleet's authority only (the deploy put its certificate beside the gateway's).
tls = ssl.create_default_context(cafile="/etc/glm-flash-gateway/fleet-ca.crt")
def code(path, key=None, body=None):
    req = urllib.request.Request(base + path, data=body and json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=30, context=tls) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
chat = {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
def answer(body):  # an authorised completion through the router to a worker: (status, its text)
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=120, context=tls) as r:
            return r.status, json.load(r)["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as e:
        return e.code, ""
status, content = answer(dict(chat, max_tokens=8, stream=False))
print(json.dumps({
    "chat_key": status,
    "chat_key_content": content,
    "models_key": code("/v1/models", key),
    "chat_nokey": code("/v1/chat/completions", None, chat),
    "chat_badkey": code("/v1/chat/completions", "wrong-" + key, chat),
    "workers_nokey": code("/workers"),
    "workers_key": code("/workers", key),
    "workers_post_key": code("/workers", key, {"url": "http://192.0.2.1:30000"}),
}))
"""


@pytest.fixture(scope="module")
def gateway(request):
    """The checked host's gateway settings, from the inventory's `gateway` group."""
    old = os.getcwd()
    os.chdir(REPO)
    try:
        entries = runpy.run_path(str(REPO / request.config.getoption("--inventory"))).get(GATEWAY, [])
    finally:
        os.chdir(old)
    hosts = request.config.getoption("hosts") or ""
    wanted = hosts.split("://")[-1].split("@")[-1].split(":")[0].split("?")[0]
    for name, data in entries:
        if wanted in (name, data.get("ssh_hostname")):
            return gateway_profile(name, data)
    pytest.skip("not applicable: this host is not the fleet's gateway")


def test_gateway_unit_enabled_and_active(host, gateway):
    svc = host.service(UNIT)
    assert svc.is_enabled and svc.is_running


def test_gateway_listens_where_clients_reach_it(host, gateway):
    assert host.socket(f"tcp://{gateway.gateway_listen_host}:{gateway.gateway_port}").is_listening


def listeners(host, port: int) -> dict[str, str]:
    """Each listening TCP socket on `port`: its local address and the process holding it."""
    out = host.check_output(f"ss -Hltnp 'sport = :{port}'")
    found = {}
    for line in out.splitlines():
        fields = line.split()
        local = fields[3].rsplit(":", 1)[0]
        found[local] = (re.search(r'users:\(\("([^"]+)"', line) or [None, "?"])[1]
    return found


def test_the_router_listens_on_loopback_only_and_the_front_door_where_clients_reach_it(host, gateway):
    """The router's API (its /workers among it) is guarded by the clients' key: it listens on
    127.0.0.1 only, and what clients reach on the gateway's port is nginx (glm-flash-front.service)."""
    assert set(listeners(host, gateway.gateway_router_port)) == {"127.0.0.1"}, listeners(
        host, gateway.gateway_router_port
    )
    listen = gateway.gateway_listen_host
    front = listeners(host, gateway.gateway_port)
    assert front.get(f"[{listen}]" if ":" in listen else listen) == "nginx", front


def test_the_front_door_runs_unprivileged_and_debians_nginx_does_not_run(host, gateway):
    svc = host.service(FRONT)
    assert svc.is_enabled and svc.is_running
    for pid in host.check_output(
        f"systemctl show -p ControlGroup --value {FRONT} | xargs -I{{}} cat /sys/fs/cgroup{{}}/cgroup.procs"
    ).split():
        status = host.file(f"/proc/{pid}/status").content_string
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        assert fields["Uid"].split()[0] != "0" and int(fields["CapEff"], 16) == 0, f"nginx {pid} is privileged"
    assert host.check_output("systemctl is-enabled nginx.service || true") == "masked"
    key = host.file(f"{CONF_DIR}/front.key")
    assert key.user == "root" and key.mode == 0o600
    out = host.run(f"systemd-analyze security {FRONT} --no-pager")
    score = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out.stdout).group(1))
    assert score <= 2.0, out.stdout[-3000:]


def test_gateway_runs_unprivileged(host, gateway):
    pid = host.check_output(f"systemctl show -p MainPID --value {UNIT}")
    status = host.file(f"/proc/{pid}/status").content_string
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    assert fields["Uid"].split()[0] != "0", "the router runs as root"
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1"


def test_gateway_key_is_a_root_only_credential_not_an_argument(host, gateway):
    key_file = host.file(f"{CONF_DIR}/api-key")
    assert key_file.exists and key_file.user == "root" and key_file.mode == 0o600
    unit = host.file("/etc/systemd/system/" + UNIT).content_string
    assert f"LoadCredential=api-key:{CONF_DIR}/api-key" in unit
    pid = host.check_output(f"systemctl show -p MainPID --value {UNIT}")
    key = host.file(f"{CONF_DIR}/api-key").content_string.strip()
    cmdline = host.file(f"/proc/{pid}/cmdline").content_string
    assert key and key not in cmdline


def test_gateway_answers_with_the_key_and_refuses_without(host, gateway):
    base = f"https://{gateway.gateway_listen_host.replace('0.0.0.0', '127.0.0.1')}:{gateway.gateway_port}"
    out = host.run("python3 -c %s %s", PROBE, base)
    assert out.rc == 0, out.stderr
    codes = json.loads(out.stdout)
    assert codes["models_key"] == 200
    # With the key, a completion goes through the router to a worker and comes back with text.
    assert codes["chat_key"] == 200 and codes["chat_key_content"].strip(), codes
    # The router refuses its API without the key itself (it does not reach a worker).
    assert codes["chat_nokey"] == 401 and codes["chat_badkey"] == 401
    # Its worker API is not reached through the front door, with the clients' key or without.
    assert codes["workers_nokey"] == codes["workers_key"] == codes["workers_post_key"] == 404, codes


def test_gateway_sandboxing_is_tight(host, gateway):
    """systemd's own score of the unit's sandboxing (0 best, 10 worst); the unit scores 1.2 on Debian 13."""
    out = host.run(f"systemd-analyze security {UNIT} --no-pager")
    assert out.rc == 0, out.stderr
    score = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out.stdout).group(1))
    assert score <= 2.0, out.stdout[-3000:]


def test_gateway_worker_key_is_a_root_only_credential_of_its_own(host, gateway):
    """The gateway-to-worker key (GLM_FLASH_WORKER_KEY): root's file, a credential of the unit,
    not the clients' key and on no command line (files/glm-flash-gateway-launch adds the workers with it)."""
    worker_key = host.file(f"{CONF_DIR}/worker-key")
    assert worker_key.exists and worker_key.user == "root" and worker_key.mode == 0o600
    unit = host.file("/etc/systemd/system/" + UNIT).content_string
    assert f"LoadCredential=worker-key:{CONF_DIR}/worker-key" in unit
    key = worker_key.content_string.strip()
    assert key and key != host.file(f"{CONF_DIR}/api-key").content_string.strip()
    pid = host.check_output(f"systemctl show -p MainPID --value {UNIT}")
    assert key not in host.file(f"/proc/{pid}/cmdline").content_string
