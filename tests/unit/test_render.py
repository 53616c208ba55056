"""The unit, environment and launch flags rendered from profiles."""

from pathlib import Path

import jinja2

from control.profile import build
from roles import service
from roles.engines.kt import launch

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def render(name, **ctx):
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined, keep_trailing_newline=True
    )
    return env.get_template(name).render(**ctx)


def unit(profile, api_key=False):
    return render("glm-flash.service.j2", **service.unit_context(profile, api_key))


def test_unit_runs_unprivileged_and_waits_for_a_completion():
    text = unit(build("gpu1", {}))
    assert "User=glm-flash\n" in text and "Group=glm-flash\n" in text
    assert "ExecStartPre=/opt/glm-flash/bin/glm-flash-preflight gpus 2\n" in text
    assert "ExecStart=/opt/glm-flash/bin/glm-flash-launch /etc/glm-flash/launch.json\n" in text
    # readiness asks where the engine listens (the tool maps a wildcard to loopback)
    assert "glm-flash-ready --host 127.0.0.1 --port 30000 --model glm-5.3-flash --timeout 3600" in text
    assert "TimeoutStartSec=3660\n" in text and "KillMode=control-group\n" in text
    assert "StartLimitBurst=3\n" in text and "Restart=on-failure\n" in text
    assert "UnsetEnvironment=PYTORCH_ALLOC_CONF PYTORCH_CUDA_ALLOC_CONF\n" in text
    assert "LoadCredential" not in text
    assert "OOMScoreAdjust" not in text  # no memory guard on the L40S box (its GPU memory is its own)


def test_readiness_asks_the_address_the_engine_listens_on(monkeypatch):
    """An engine bound to one address answers nowhere else: asking 127.0.0.1 would fail every
    start after startup_timeout_s, and Restart= would loop on it."""
    monkeypatch.setenv("GLM_FLASH_API_KEY", "sk-test")  # a non-loopback address needs a key
    text = unit(build("gpu1", {"listen_host": "10.0.0.5"}), api_key=True)
    assert "ExecStartPost=/opt/glm-flash/bin/glm-flash-ready --host 10.0.0.5 --port 30000 " in text


def test_unit_with_api_key_and_allocator_setting():
    text = unit(build("gpu1", {"tp_size": 1, "pytorch_alloc_conf": "max_split_size_mb:512"}), api_key=True)
    assert "LoadCredential=api-key:/etc/glm-flash/api-key\n" in text
    assert "UnsetEnvironment" not in text


def test_launch_flags_are_the_field_reports_plus_what_it_omitted():
    p = build("gpu1", {})
    args = launch.kt_args(p, numa_nodes=1)  # the report's box: NPS1, one NUMA node
    # Ours, not the report's: Prometheus metrics (roles/watch.py), the one flag without a value.
    assert args[-1] == "--enable-metrics"
    args = args[:-1]
    pairs = dict(zip(args[::2], args[1::2]))
    assert len(args) == 2 * len(pairs), "every flag takes one value"
    assert pairs["--tp-size"] == "2" and pairs["--kt-method"] == "FP8" and pairs["--kt-cpuinfer"] == "152"
    assert pairs["--kt-max-deferred-experts-per-token"] == "4"
    assert pairs["--kt-gpu-prefill-token-threshold"] == "2048" and pairs["--chunked-prefill-size"] == "32768"
    assert pairs["--max-mamba-cache-size"] == "16" and pairs["--mem-fraction-static"] == "0.55"
    assert pairs["--context-length"] == "524288" and pairs["--kv-cache-dtype"] == "fp8_e4m3"
    # The report passed no --kt-threadpool-count: the engine's default 2 ran, whatever the NUMA count.
    assert pairs["--kt-weight-path"] == p.model_path and pairs["--kt-threadpool-count"] == "2"
    assert pairs["--tool-call-parser"] == "glm47" and pairs["--reasoning-parser"] == "glm45"
    assert pairs["--host"] == "127.0.0.1"
    assert "--tp" not in pairs and "--enable-mixed-chunk" not in args


def test_threadpool_count_from_profile_wins_over_numa_fact():
    args = launch.kt_args(build("gpu1", {"kt_threadpool_count": 1}), numa_nodes=4)
    assert args[args.index("--kt-threadpool-count") + 1] == "1"


def test_threadpool_count_none_reads_the_numa_nodes():
    args = launch.kt_args(build("gpu1", {"kt_threadpool_count": None}), numa_nodes=4)
    assert args[args.index("--kt-threadpool-count") + 1] == "4"


def test_environment_selects_the_toolkit_by_path_and_transport():
    env = launch.kt_env(build("gpu1", {}))
    assert env["CUDA_HOME"] == "/usr/local/cuda-12.8"
    assert env["PATH"].startswith("/opt/glm-flash/engine/current/bin:/usr/local/cuda-12.8/bin:")
    assert env["SGLANG_KT_GLM5_NEXT_FP8_TRANSPORT"] == "native"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env and "PYTORCH_ALLOC_CONF" not in env
    text = render("glm-flash.env.j2", state_dir="/var/lib/glm-flash", extra_env=env)
    assert "HF_HUB_OFFLINE=1\n" in text and "CUDA_HOME=/usr/local/cuda-12.8\n" in text


def directives(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_unit_is_sandboxed_as_a_cuda_server_tolerates():
    d = directives(unit(build("gpu1", {})))
    assert d["CapabilityBoundingSet"] == [""] and d["AmbientCapabilities"] == [""]
    assert d["NoNewPrivileges"] == ["yes"] and d["ProtectSystem"] == ["strict"] and d["ProtectHome"] == ["yes"]
    assert d["StateDirectory"] == ["glm-flash"] and d["StateDirectoryMode"] == ["0750"]
    assert d["DevicePolicy"] == ["closed"] and "char-nvidia-uvm rw" in d["DeviceAllow"]
    assert d["UMask"] == ["0077"] and d["ProcSubset"] == ["all"]
    assert d["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"]
    allowed = d["SystemCallFilter"][0].split()
    assert allowed[0] == "@system-service"
    assert {"mbind", "set_mempolicy", "get_mempolicy", "migrate_pages", "move_pages", "sched_setaffinity"} <= set(
        allowed
    )
    # what the engine cannot run without
    assert "MemoryDenyWriteExecute" not in d and "PrivateDevices" not in d
    # root prepares the GPU before this unit's device policy is built
    assert d["Requires"] == ["glm-flash-gpu.service"] and "glm-flash-gpu.service" in d["After"][0]


def test_log_filter_only_where_systemd_has_it():
    p = build("gpu1", {})
    new = render("glm-flash.service.j2", **service.unit_context(p, True, 253))
    assert f"LogFilterPatterns=~{service.KEY_LOG_PATTERN}\n" in new
    old = render("glm-flash.service.j2", **service.unit_context(p, True, 252))
    assert "LogFilterPatterns" not in old


def test_gpu_unit_is_skipped_without_the_driver():
    d = directives(render("glm-flash-gpu.service.j2"))
    assert d["ConditionPathExists"] == ["/proc/driver/nvidia/version"]
    assert d["Type"] == ["oneshot"] and d["RemainAfterExit"] == ["yes"]
    assert d["ExecStart"][0] == "/usr/sbin/modprobe nvidia-uvm"


def test_a_fleet_worker_behind_a_gateway_lets_in_only_loopback_itself_the_gateway_and_allow_from(monkeypatch):
    monkeypatch.setenv("GLM_FLASH_WORKER_KEY", "worker-key-0123456789")
    p = build(
        "gpu1",
        {
            "listen_host": "0.0.0.0",
            "api_key_env": "GLM_FLASH_WORKER_KEY",
            "fleet_own_address": "10.0.0.11",
            "fleet_gateway_address": "10.0.0.2",
            "fleet_peer_port": 30080,
            "engine_allow_from": ["10.5.0.0/24"],
        },
    )
    text = unit(p, api_key=True)
    assert "\nIPAddressDeny=any\nIPAddressAllow=localhost 10.0.0.11 10.0.0.2 10.5.0.0/24\n" in text
    assert "\nSocketBindDeny=tcp:30080\n" in text
    # Only the peer port: NCCL/Gloo/torch.distributed bind ports of their own between the TP workers.
    assert "SocketBindAllow" not in text


def test_a_single_node_has_no_address_filter_nor_bind_deny():
    text = unit(build("gpu1", {}))
    assert "IPAddress" not in text and "SocketBind" not in text


def test_the_engine_environment_is_offline():
    env = render("glm-flash.env.j2", state_dir="/var/lib/glm-flash", extra_env={})
    assert "\nHF_HUB_OFFLINE=1\n" in env


def test_behind_the_address_filter_nccl_and_gloo_stay_on_loopback(monkeypatch):
    monkeypatch.setenv("GLM_FLASH_WORKER_KEY", "worker-key-0123456789")
    worker = build(
        "gpu1",
        {
            "listen_host": "0.0.0.0",
            "api_key_env": "GLM_FLASH_WORKER_KEY",
            "fleet_own_address": "10.0.0.11",
            "fleet_gateway_address": "10.0.0.2",
        },
    )
    assert service.tp_env(worker) == {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
    # a single node too (#36 item 7): TP stays in the host, NCCL's bootstrap never on the LAN
    gb10 = {"platform": "gb10", "vllm_ref": "0123456789abcdef0123456789abcdef01234567", "accept_drafter_license": True}
    for single in (build("gpu1", {}), build("gpu1", gb10)):
        env = service.tp_env(single)
        assert env == {"NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo"}
