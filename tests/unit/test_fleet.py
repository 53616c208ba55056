"""A fleet inventory: workers serve the same thing by construction, mistakes stop it before contact."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import jinja2
import pytest

from control.fleet import fleet, gateway_profile
from roles.fleet.gateway import front_conf, router_args, tls_names
from tests.conftest import REPO

COMMIT = "a" * 40
WORKER = {"ssh_user": "root", "listen_host": "0.0.0.0"}
WORKER_KEY = "worker-key-0123456789"
GW = {"ssh_hostname": "10.0.0.2"}
# The network between these example machines is the fleet's own (the knob a real fleet off loopback needs).
PRIVATE = {"fleet_network_private": True}


def workers(n=2, **extra):
    return [(f"gpu{i}.invalid", {**WORKER, **extra}) for i in range(1, n + 1)]


@pytest.fixture(autouse=True)
def _key(monkeypatch):
    monkeypatch.setenv("GLM_FLASH_API_KEY", "k")
    monkeypatch.setenv("GLM_FLASH_WORKER_KEY", WORKER_KEY)


def refused(capsys, **kw) -> str:
    with pytest.raises(SystemExit) as e:
        fleet(**kw)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_shared_values_reach_every_worker_and_the_gateway_gets_their_urls():
    w, g = fleet(
        shared={**PRIVATE, "model_revision": COMMIT, "engine_set": "0.7.0.post4"},
        workers=[("10.0.0.11", WORKER), ("gpu2.invalid", {**WORKER, "ssh_hostname": "10.0.0.12", "port": 30001})],
        gateway=("gw.invalid", GW),
    )
    assert [d["engine_set"] for _, d in w] == ["0.7.0.post4", "0.7.0.post4"]
    assert [d["model_revision"] for _, d in w] == [COMMIT, COMMIT]
    assert g[0][1]["gateway_workers"] == ["http://10.0.0.11:30000", "http://10.0.0.12:30001"]


def test_a_worker_overriding_a_shared_value_is_refused(capsys):
    err = refused(
        capsys,
        shared={**PRIVATE, "model_revision": COMMIT},
        workers=[("gpu1.invalid", WORKER), ("gpu2.invalid", {**WORKER, "model_revision": "b" * 40})],
    )
    assert f"gpu2.invalid: model_revision: '{'b' * 40}' differs from the fleet's shared '{COMMIT}'" in err
    assert "no host was changed" in err


def test_workers_that_would_serve_different_things_are_refused(capsys):
    err = refused(
        capsys,
        shared={**PRIVATE, "model_revision": COMMIT},
        workers=[("gpu1.invalid", WORKER), ("gpu2.invalid", {**WORKER, "served_model_name": "other"})],
    )
    assert "gpu2.invalid: served_model_name: resolves to 'other' but gpu1.invalid serves 'glm-5.3-flash'" in err


def test_a_malformed_worker_entry_is_refused(capsys):
    err = refused(capsys, shared={}, workers=[("gpu1.invalid", WORKER), "gpu2.invalid"])
    assert "(entry): is not a (name, {data}) pair" in err


def test_a_moving_model_revision_is_refused_for_a_downloading_fleet(capsys):
    err = refused(capsys, shared={}, workers=workers())
    assert "(shared): model_revision: 'main' moves" in err
    # One worker, or a staged checkpoint, cannot diverge.
    fleet(shared={**PRIVATE, "model_download": False}, workers=workers())
    fleet(shared={}, workers=workers(1))


def test_a_worker_on_loopback_behind_a_gateway_is_refused(capsys):
    err = refused(
        capsys,
        shared={**PRIVATE, "model_revision": COMMIT},
        workers=[("gpu1.invalid", {"listen_host": "127.0.0.1"})],
        gateway=("gw.invalid", GW),
    )
    assert "gpu1.invalid: listen_host: the worker listens on loopback only" in err


def test_gateway_mistakes_are_refused(capsys, monkeypatch):
    err = refused(
        capsys,
        shared={**PRIVATE, "model_revision": COMMIT},
        workers=workers(),
        gateway=("gw.invalid", {"gateway_polcy": "round_robin"}),
    )
    assert "gw.invalid: gateway_polcy: is not a gateway setting" in err
    monkeypatch.delenv("GLM_FLASH_API_KEY")
    with pytest.raises(Exception) as e:
        gateway_profile("gw.invalid", {"gateway_workers": ["http://w:30000"]})
    assert "exposes the gateway without an API key" in str(e.value)


def test_router_flags_carry_the_settings_and_never_the_key():
    p = gateway_profile(
        "gw.invalid", {"gateway_workers": ["http://a:30000", "http://b:30000"], "gateway_health_interval_s": 7}
    )
    args = router_args(p)
    # Workers named on the router's command line would be sent the router's (the clients') key.
    assert "--worker-urls" not in args and "http://a:30000" not in args
    assert args[args.index("--health-check-interval-secs") + 1] == "7"
    assert args[args.index("--policy") + 1] == "cache_aware"
    assert not any("api-key" in a or a == "k" for a in args)
    # The router (and its /workers API) on loopback only, on its own port: the front door is the way in.
    assert args[args.index("--host") + 1] == "127.0.0.1" and args[args.index("--port") + 1] == "30001"


def front_door(p) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "templates"), undefined=jinja2.StrictUndefined)
    return env.get_template("glm-flash-front.conf.j2").render(**front_conf(p))


def test_the_front_door_forwards_the_openai_routes_and_health_only_to_the_router_on_loopback():
    p = gateway_profile(
        "10.0.0.5",
        {"gateway_workers": ["http://10.0.0.6:30000"], "gateway_listen_host": "10.0.0.5", "gateway_router_port": 31001},
    )
    conf = front_door(p)
    assert "listen 10.0.0.5:30000 ssl;" in conf
    assert re.findall(r"server (\S+);", conf) == ["127.0.0.1:31001"]
    # Each location an exact path, passed to the router as that path; everything else answers 404.
    routes = dict(re.findall(r"location = (\S+) \{\s*proxy_pass http://router(\S+);", conf))
    assert routes == {r: r for r in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health")}
    assert re.findall(r"location (\S+) \{", conf) == ["/"] and "return 404" in conf.split("location / {")[1]
    assert "client_max_body_size 16m;" in conf and "rate=20r/s" in conf
    assert "ssl_certificate_key /run/credentials/glm-flash-front.service/tls-key;" in conf
    six = gateway_profile("gw", {"gateway_workers": ["http://[fd00::6]:30000"], "gateway_listen_host": "fd00::5"})
    assert "listen [fd00::5]:30000 ssl;" in front_door(six)


def test_the_certificate_names_the_gateways_address_its_listen_address_and_the_operators_names():
    p = gateway_profile(
        "gw",
        {
            "gateway_workers": ["http://10.0.0.6:30000"],
            "gateway_listen_host": "10.1.0.5",
            "gateway_tls_names": ["llm.lan"],
        },
    )
    assert tls_names(p, "10.0.0.5") == ["10.0.0.5", "10.1.0.5", "127.0.0.1", "llm.lan"]
    wildcard = gateway_profile("gw", {"gateway_workers": ["http://10.0.0.6:30000"]})
    assert tls_names(wildcard, "10.0.0.5") == ["10.0.0.5", "127.0.0.1"]


def test_the_gateways_ports_are_its_own():
    for key in ("gateway_router_port", "gateway_metrics_port"):
        with pytest.raises(Exception) as e:
            gateway_profile("gw", {"gateway_workers": ["http://10.0.0.6:30000"], key: 30000})
        assert f"{key}: 30000 is also another of the gateway's ports" in str(e.value)


def test_a_mismatched_fleet_stops_pyinfra_before_connecting(tmp_path):
    inv = tmp_path / "fleet_bad.py"
    inv.write_text(
        textwrap.dedent(f"""
        from control.fleet import fleet
        workers, gateway = fleet(
            shared={{"model_revision": {COMMIT!r}}},
            workers=[("gpu1.invalid", {json.dumps(WORKER)}), ("gpu2.invalid", {{"engine_set": "0.7.2"}})],
        )
    """)
    )
    run = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(inv), "deploy_fleet.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "GLM_FLASH_API_KEY": "k"},
    )
    out = run.stdout + run.stderr
    assert run.returncode == 2, out
    assert "gpu2.invalid: engine_set: resolves to '0.7.2' but gpu1.invalid serves '0.7.0.post1'" in out
    assert "Traceback" not in out and "Connecting to hosts" not in out


def test_the_example_fleet_inventory_is_refused_until_its_placeholders_are_replaced():
    run = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", "inventory/fleet.py", "deploy_fleet.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "GLM_FLASH_API_KEY": "k", "HOME": "/nonexistent"},
    )
    out = run.stdout + run.stderr
    assert run.returncode == 2 and "Traceback" not in out
    for host in ("gpu1", "gpu2", "gpu3", "gw"):
        assert f"{host}.example.lan: (host name): '{host}.example.lan' is the example inventory's placeholder" in out
    assert "ssh_key: '~/.ssh/id_ed25519' does not exist" in out
    # Its network is not declared private: the operator says so, or the fleet stays on loopback.
    assert "(shared): fleet_network_private: is not True, and the fleet's machines talk over gpu1.example.lan" in out


def test_the_gateway_launcher_refuses_a_key_in_its_flags(tmp_path):
    conf = tmp_path / "router.json"
    conf.write_text(json.dumps({"args": ["--port", "30000", "--api-key=secret"]}))
    run = subprocess.run(
        [sys.executable, str(REPO / "files" / "glm-flash-gateway-launch"), str(conf)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode != 0 and "the key comes from the credential only" in run.stderr
    assert "secret" not in run.stderr


def test_every_gateway_string_knob_has_a_shape():
    from control.fleet import GATEWAY_KNOBS

    for key, knob in GATEWAY_KNOBS.items():
        strings = knob.kind is str or knob.kind is list
        if strings:
            assert knob.pattern or knob.choices, f"{key}: give it a pattern or choices"


def test_a_gateway_value_with_shell_characters_is_refused():
    from control.fleet import gateway_profile
    from control.profile import ProfileError

    with pytest.raises(ProfileError) as e:
        gateway_profile("gw.lan", {"gateway_dir": "/opt/gw;$(id)", "gateway_workers": ["http://10.0.0.2:30000"]})
    assert any(p.key == "gateway_dir" for p in e.value.problems)


@pytest.mark.parametrize(
    "value, problem",
    [
        ("gpu1.lan", "is not"),  # a host name: the pattern of an IP address
        ("999.1.1.1", "is not an IP address"),
        ("10.0.0.1;x", "is not"),
    ],
)
def test_a_fleet_address_that_is_not_an_ip_address_is_refused(capsys, value, problem):
    err = refused(
        capsys,
        shared={**PRIVATE, "model_revision": COMMIT},
        workers=[("gpu1.invalid", {**WORKER, "fleet_address": value}), ("gpu2.invalid", WORKER)],
    )
    assert "gpu1.invalid: fleet_address: " in err and problem in err and "no host was changed" in err


def test_two_workers_with_one_fleet_address_are_refused_and_distinct_ones_pass(capsys):
    err = refused(
        capsys,
        shared={**PRIVATE, "model_revision": COMMIT, "fleet_address": "10.0.0.1"},
        workers=workers(),
    )
    assert "gpu2.invalid: fleet_address: 10.0.0.1 is also gpu1.invalid's" in err
    w, _ = fleet(
        shared={**PRIVATE, "model_revision": COMMIT},
        workers=[
            ("gpu1.invalid", {**WORKER, "fleet_address": "10.0.0.1"}),
            ("gpu2.invalid", {**WORKER, "fleet_address": "fd00::2"}),
        ],
    )
    assert [d["fleet_address"] for _, d in w] == ["10.0.0.1", "fd00::2"]


def test_the_peer_server_unit_is_unprivileged_and_its_token_is_no_argument():
    """serving(): the command the deploy runs to start a worker's peer file server (the fleet sandbox
    runs it: tests/fleet/test_peer_server.py)."""
    from roles.fleet.artifacts import RUNTIME_MAX_S, serving

    (cmd,) = serving(
        "u",
        "/opt/glm-flash/bin/glm-flash-peer",
        "/opt/glm-flash",
        "/m.txt",
        "10.0.0.1",
        ["10.0.0.2"],
        "/t/x.token",
        idle=120,
    )
    for prop in ("DynamicUser=yes", "CapabilityBoundingSet=", "ProtectSystem=strict", "IPAddressDeny=any"):
        assert f"-p {prop} " in cmd or f"-p '{prop}" in cmd, prop
    assert "IPAddressAllow=10.0.0.2" in cmd and "--allow 10.0.0.2" in cmd and "--bind 10.0.0.1" in cmd
    assert f"RuntimeMaxSec={RUNTIME_MAX_S}" in cmd and RUNTIME_MAX_S <= 3600 and "--idle 120" in cmd
    assert "LoadCredential=peer-token:/t/x.token" in cmd and "--token-credential peer-token" in cmd
    # The token file stays for a fetch on the same worker (it serves what it holds and receives what
    # it lacks): the fetch removes it once done, whatever its outcome, and so does the stop (#36 L10).
    assert "rm -f" not in cmd
    from roles.fleet.artifacts import fetching, stopping

    receiver = type(
        "Host", (), {"name": "w1", "data": type("Data", (), {"dict": lambda self: {"fleet_address": "10.0.0.1"}})()}
    )()
    holder = type(
        "Host", (), {"name": "w2", "data": type("Data", (), {"dict": lambda self: {"fleet_address": "10.0.0.3"}})()}
    )()
    (fetch,) = fetching(
        "/opt/glm-flash/bin/glm-flash-peer",
        "/opt/glm-flash",
        "/m.txt",
        [holder],
        receiver,
        "/t/x.token",
        nbytes=8 << 30,
    )
    # Not root's session (#36 M2): a transient unit of its own dynamic user, no privileges, writing only
    # its StateDirectory, reaching only the holder (aria2 cannot refuse a redirect: elsewhere fails to
    # connect), the token a credential, a deadline from the bytes; root then adopts what it staged.
    unit, rest = fetch.split(" -- ", 1)
    unit += " "
    assert (
        "systemd-run --quiet --wait --pipe --collect --service-type=exec --unit glm-flash-peer-fetch-artifacts" in unit
    )
    for prop in (
        "DynamicUser=yes",
        "CapabilityBoundingSet=",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "IPAddressDeny=any",
        "IPAddressAllow=10.0.0.3",
        "StateDirectory=glm-flash-peer-fetch-artifacts",
        "LoadCredential=peer-token:/t/x.token",
        f"RuntimeMaxSec={900 + 2048 + 300}",
    ):
        assert f"-p {prop} " in unit or f"-p '{prop}" in unit, prop
    assert "ReadWritePaths" not in unit and "--token-file" not in fetch
    assert rest.startswith(
        "/usr/bin/python3 /opt/glm-flash/bin/glm-flash-peer fetch /opt/glm-flash /m.txt --source http://10.0.0.3:"
    )
    assert "--token-credential peer-token --interface 10.0.0.1 --stage /var/lib/glm-flash-peer-fetch-artifacts" in rest
    assert rest.index("rm -f /t/x.token") < rest.index(
        "/usr/bin/python3 /opt/glm-flash/bin/glm-flash-peer adopt /var/lib/glm-flash-peer-fetch-artifacts /opt/glm-flash /m.txt"
    )
    assert stopping("u", "/t/x.token")[0].startswith("rm -f /t/x.token; systemctl stop u")


def test_each_run_starts_its_servers_under_names_of_its_own():
    """A run's peer servers are glm-flash-peer-serve-<set>-<run's tag>: the same name from start to
    stop within the run, another in the next run. systemd 257 held a stopped server's fixed name for
    about 135 s on the fleet sandbox; the next run waited for it while another worker's server
    stopped itself for want of a request, and the receiver failed (seen in CI)."""
    from control import run_record
    from roles.fleet.artifacts import UNIT, server_unit

    run_record.reset()
    first = server_unit("artifacts")
    assert first == server_unit("artifacts") and first.startswith(f"{UNIT}-artifacts-")
    assert server_unit("glm-flash-model-download") != first
    run_record.reset()
    assert server_unit("artifacts") != first
    assert re.fullmatch(r"[a-zA-Z0-9:_.\\-]+", first) and len(first) < 100  # a valid unit name


def ip_workers(n=2, **extra):
    return [(f"gpu{i}.invalid", {**WORKER, "ssh_hostname": f"10.0.0.{10 + i}", **extra}) for i in range(1, n + 1)]


def test_workers_behind_a_gateway_hold_the_worker_key_and_let_in_only_the_gateway():
    w, g = fleet(shared={**PRIVATE, "model_revision": COMMIT}, workers=ip_workers(), gateway=("gw.invalid", GW))
    for i, (_, d) in enumerate(w, 1):
        # The worker's engine reads its key from GLM_FLASH_WORKER_KEY, never the clients' GLM_FLASH_API_KEY.
        assert d["api_key_env"] == "GLM_FLASH_WORKER_KEY"
        assert (d["fleet_gateway_address"], d["fleet_own_address"], d["fleet_peer_port"]) == (
            "10.0.0.2",
            f"10.0.0.{10 + i}",
            30080,
        )
    assert g[0][1].get("api_key_env", "GLM_FLASH_API_KEY") == "GLM_FLASH_API_KEY"


def test_the_worker_key_is_refused_unset_equal_to_the_clients_or_misshapen(capsys, monkeypatch):
    kw = dict(shared={**PRIVATE, "model_revision": COMMIT}, workers=ip_workers(), gateway=("gw.invalid", GW))
    monkeypatch.delenv("GLM_FLASH_WORKER_KEY")
    assert "gw.invalid: GLM_FLASH_WORKER_KEY: is not set" in refused(capsys, **kw)
    monkeypatch.setenv("GLM_FLASH_WORKER_KEY", "k")
    err = refused(capsys, **kw)
    assert "GLM_FLASH_WORKER_KEY: is the clients' key (GLM_FLASH_API_KEY): a worker would hold it" in err
    assert "Fix: export GLM_FLASH_WORKER_KEY=" in err
    monkeypatch.setenv("GLM_FLASH_WORKER_KEY", "short key")
    err = refused(capsys, **kw)
    assert "GLM_FLASH_WORKER_KEY: is not 16 to 4096 printable characters" in err and "short key" not in err
    # Without a gateway the workers keep their own key (GLM_FLASH_API_KEY): no worker key needed.
    monkeypatch.delenv("GLM_FLASH_WORKER_KEY")
    w, _ = fleet(shared={**PRIVATE, "model_revision": COMMIT}, workers=ip_workers())
    assert all("api_key_env" not in d and d["fleet_peer_port"] == 30080 for _, d in w)


def test_names_where_the_engine_unit_needs_addresses_are_refused(capsys):
    err = refused(capsys, shared={**PRIVATE, "model_revision": COMMIT}, workers=workers(), gateway=("gw.invalid", {}))
    assert "gw.invalid: (host name): 'gw.invalid' is a name" in err
    assert "gpu1.invalid: ssh_hostname: 'gpu1.invalid' is a name" in err


def test_fleet_set_values_are_refused_in_a_worker_entry(capsys):
    err = refused(
        capsys,
        shared={**PRIVATE, "model_revision": COMMIT},
        workers=ip_workers(1, fleet_gateway_address="10.9.9.9", api_key_env="MY_KEY"),
        gateway=("gw.invalid", GW),
    )
    assert "gpu1.invalid: fleet_gateway_address: is set by the fleet, not per worker" in err
    assert "gpu1.invalid: api_key_env: is set by the fleet, not per worker" in err


def test_engine_allow_from_takes_addresses_and_networks_only(capsys):
    w, _ = fleet(
        shared={**PRIVATE, "model_revision": COMMIT, "engine_allow_from": ["10.1.0.0/16", "fd00::7"]},
        workers=ip_workers(),
        gateway=("gw.invalid", GW),
    )
    assert w[0][1]["engine_allow_from"] == ["10.1.0.0/16", "fd00::7"]
    for bad, said in (
        ("10.1.0.300", "'10.1.0.300' is not an IP address or network"),
        ("prom.lan", "is not an IPv4 or IPv6 address, or a network in CIDR form"),
        ("10.0.0.0/24 any", "is not an IPv4 or IPv6 address"),
    ):
        err = refused(
            capsys,
            shared={**PRIVATE, "model_revision": COMMIT, "engine_allow_from": [bad]},
            workers=ip_workers(),
            gateway=("gw.invalid", GW),
        )
        assert "engine_allow_from: " in err and said in err, err


def test_roll_settings_differing_between_workers_are_refused(capsys):
    err = refused(
        capsys,
        shared={**PRIVATE, "model_revision": COMMIT},
        workers=[ip_workers(1)[0], ("gpu2.invalid", {**WORKER, "ssh_hostname": "10.0.0.12", "roll_batch": 2})],
        gateway=("gw.invalid", GW),
    )
    assert "gpu2.invalid: roll_batch: resolves to 2 but gpu1.invalid serves 1" in err


# --- the fleet's network: no key or checkpoint in clear over a network the repo does not know ----


def test_a_fleet_off_loopback_is_refused_until_the_operator_says_its_network_is_private(capsys):
    err = refused(capsys, shared={"model_revision": COMMIT}, workers=ip_workers(), gateway=("gw.invalid", GW))
    assert "(shared): fleet_network_private: is not True, and the fleet's machines talk over 10.0.0.11, " in err
    assert "10.0.0.2: the gateway's requests to the workers carry the worker key" in err
    assert "set fleet_network_private: True in shared=" in err
    # The operator's word: accepted, and the gateway's profile carries it too.
    w, g = fleet(shared={**PRIVATE, "model_revision": COMMIT}, workers=ip_workers(), gateway=("gw.invalid", GW))
    assert [d["fleet_network_private"] for _, d in w] == [True, True]
    assert gateway_profile(*g[0]).fleet_network_private is True


def test_workers_that_exchange_files_off_loopback_need_it_without_a_gateway_too(capsys):
    # Two workers, no gateway: the seed sends the others the checkpoint over fleet_address.
    err = refused(
        capsys,
        shared={"model_revision": COMMIT},
        workers=[("gpu1.invalid", {**WORKER, "fleet_address": "192.168.7.1"}), ("127.0.0.1", WORKER)],
    )
    assert "fleet_network_private: is not True, and the fleet's machines talk over 192.168.7.1:" in err
    assert "127.0.0.1" not in err.split("talk over")[1].split(":")[0]


def test_a_fleet_on_loopback_or_with_no_traffic_between_machines_needs_no_word():
    on_one_machine = [(f"node{i}", {**WORKER, "ssh_hostname": f"127.9.9.{i}"}) for i in (2, 3)]
    fleet(shared={"model_revision": COMMIT}, workers=on_one_machine, gateway=("gw", {"ssh_hostname": "127.9.9.1"}))
    fleet(shared={}, workers=workers(1))  # one worker, no gateway: no fleet traffic at all


def test_the_network_is_the_fleets_so_a_worker_cannot_set_it_alone(capsys):
    err = refused(
        capsys,
        shared={"model_revision": COMMIT},
        workers=[(n, {**d, **PRIVATE}) if n.startswith("gpu1") else (n, d) for n, d in workers()],
    )
    assert "gpu1.invalid: fleet_network_private: is set per worker. Fix: set it once in shared=" in err


def test_the_summary_of_each_worker_says_what_the_fleets_traffic_crosses():
    from control.profile import build
    from roles.summary import fleet_network, render

    w, _ = fleet(shared={**PRIVATE, "model_revision": COMMIT}, workers=ip_workers(), gateway=("gw.invalid", GW))
    said = fleet_network(build(*w[0]))
    assert said.startswith("private, by the operator's word (fleet_network_private)") and "unencrypted" in said
    looped = [(f"node{i}", {**WORKER, "ssh_hostname": f"127.9.9.{i}"}) for i in (2, 3)]
    w, _ = fleet(shared={"model_revision": COMMIT}, workers=looped, gateway=("gw", {"ssh_hostname": "127.9.9.1"}))
    assert fleet_network(build(*w[0])).startswith("loopback")
    host = {"result": "deployed", "refused": [], "skipped": [], "fleet_network": said}
    assert f"        fleet_network: {said}" in render({"gpu1": host}).splitlines()


def test_the_gateways_summary_names_where_clients_go_as_a_workers_does():
    """A gateway listening on every address is reached at its own; one listening on one address at
    that address (the rule of the workers' endpoint, over TLS)."""
    from roles.summary import endpoint

    assert endpoint("0.0.0.0", 30000, "gw.lan", "https") == "https://gw.lan:30000/v1"
    assert endpoint("10.0.0.2", 30000, "gw.lan", "https") == "https://10.0.0.2:30000/v1"
    assert endpoint("::", 30000, "gw.lan") == "http://gw.lan:30000/v1"
