"""glm-flash.service: installed, enabled, secured, and running where the host can run it."""

import json
import re
import shlex
from datetime import datetime

import pytest


def test_unit_enabled(host):
    assert host.service("glm-flash").is_enabled


def test_unit_is_valid_for_the_hosts_systemd(host):
    out = host.run("systemd-analyze verify /etc/systemd/system/glm-flash.service 2>&1")
    assert out.rc == 0 and out.stdout.strip() == "", out.stdout


def test_runs_as_service_user_and_stops_whole_tree(host, profile):
    show = host.check_output("systemctl show glm-flash.service -p User -p KillMode -p Restart -p UnsetEnvironment")
    assert f"User={profile.service_user}" in show
    assert "KillMode=control-group" in show and "Restart=on-failure" in show
    if not profile.pytorch_alloc_conf:
        assert "PYTORCH_CUDA_ALLOC_CONF" in show and "PYTORCH_ALLOC_CONF" in show


def test_configuration_files_are_not_world_readable(host, profile):
    for path in ("/etc/glm-flash/glm-flash.env", "/etc/glm-flash/launch.json"):
        f = host.file(path)
        assert f.exists and f.user == "root" and f.group == profile.service_user and f.mode == 0o640
    key = host.file("/etc/glm-flash/api-key")
    if key.exists:
        assert key.mode == 0o600 and key.user == "root"


# The L40S field report (/work/shared/seeds/000_*, docs/sources.md §1), written here literally:
# the repo's profile defaults are supposed to reproduce these, so they are not read from the repo.
# Each: (sglang flag, the argparse dest, the report's value, the inventory knob that may override it).
L40S_REPORT_FLAGS = [
    ("--tp-size", "tensor_parallel_size", 2, "tp_size"),  # Hardware: "2x NVIDIA L40S ... TP=2"; Stack: "Launch: TP2"
    ("--kt-method", "kt_method", "FP8", "kt_method"),  # Stack: "--kt-method FP8"
    ("--kt-cpuinfer", "kt_cpuinfer", 152, "kt_cpuinfer"),  # Stack: "--kt-cpuinfer 152"
    # Stack: "--kt-max-deferred-experts-per-token 4"
    (
        "--kt-max-deferred-experts-per-token",
        "kt_max_deferred_experts_per_token",
        4,
        "kt_max_deferred_experts_per_token",
    ),
    # Stack: "--kt-gpu-prefill-token-threshold 2048 (layerwise GPU prefill)"
    ("--kt-gpu-prefill-token-threshold", "kt_gpu_prefill_token_threshold", 2048, "kt_gpu_prefill_token_threshold"),
    # Update (Sept 4), "Chunked prefill: 32k is the measured optimum on sm_89": 32,768 "new default"
    # (the first post's Stack had 16384, before that sweep)
    ("--chunked-prefill-size", "chunked_prefill_size", 32768, "chunked_prefill_size"),
    (
        "--max-mamba-cache-size",
        "max_mamba_cache_size",
        16,
        "max_mamba_cache_size",
    ),  # Stack: "--max-mamba-cache-size 16"
    (
        "--mem-fraction-static",
        "mem_fraction_static",
        0.55,
        "mem_fraction_static",
    ),  # Stack: "--mem-fraction-static 0.55"
    (
        "--context-length",
        "context_length",
        524288,
        "context_length",
    ),  # Stack: "context 524k"; table: "524k per request"
    ("--kv-cache-dtype", "kv_cache_dtype", "fp8_e4m3", "kv_cache_dtype"),  # Stack: "KV fp8_e4m3"
    # The report's launch has no --kt-threadpool-count: the engine's default, 2, ran (docs/sources.md §5).
    ("--kt-threadpool-count", "kt_threadpool_count", 2, "kt_threadpool_count"),
]
# The report states no --max-running-requests nor --attention-backend: the spec must not add them either
# (the engine's own defaults, as on the reporter's box).
NOT_IN_THE_REPORT = ("--max-running-requests", "--attention-backend")


def _expected_flags(inventory_data) -> dict[str, tuple[str, object]]:
    """The report's values, except a knob the inventory sets: then the inventory's own literal value."""
    _, data = inventory_data
    return {flag: (dest, data.get(knob, value)) for flag, dest, value, knob in L40S_REPORT_FLAGS}


def _flag_values(args: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for i, a in enumerate(args):
        if a.startswith("--"):
            assert a not in values, f"{a} given twice in launch.json"
            values[a] = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else ""
    return values


@pytest.fixture(scope="module")
def launch(host) -> dict:
    return json.loads(host.file("/etc/glm-flash/launch.json").content_string)


def test_launch_flags_are_the_field_reports(launch, profile, inventory_data):
    """launch.json against the L40S field report's launch flags (and the inventory's literal
    overrides, e.g. the sandbox's kt_cpuinfer 2), not against the code that wrote it."""
    if profile.platform != "l40s":
        pytest.skip("not applicable: these are the L40S report's flags")
    assert launch["module"] == "sglang.launch_server"
    assert launch["python"] == f"{profile.install_root}/engine/current/bin/python"  # README: "The engine runs from"
    given = _flag_values(launch["args"])
    for flag, (_, want) in _expected_flags(inventory_data).items():
        assert flag in given, f"{flag} is missing from launch.json"
        assert float(given[flag]) == want if isinstance(want, float) else given[flag] == str(want), (
            f"{flag} {given[flag]} in launch.json, the report (or the inventory) says {want}"
        )
    for flag in NOT_IN_THE_REPORT:
        assert flag not in given, f"{flag} is not in the report's launch"
    assert "--api-key" not in launch["args"], "the key is added by the launcher, never written in the flags"


# Run on the host with the engine's own python: sglang's parser exactly as sglang.launch_server
# builds it (ServerArgs.add_cli_args on a fresh argparse parser). Prints the parsed values and
# whatever the parser did not know. Never constructs ServerArgs (that probes GPUs).
_PARSE = """
import argparse, json, sys
from sglang.srt.server_args import ServerArgs
spec = json.load(open("/etc/glm-flash/launch.json"))
parser = argparse.ArgumentParser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
ns, unknown = parser.parse_known_args(spec["args"] + [spec["api_key_flag"], "placeholder"])
print(json.dumps({"parsed": vars(ns), "unknown": unknown}, default=str))
"""


def test_launch_flags_parse_with_the_installed_engine_as_the_report_says(host, launch, profile, inventory_data):
    """The installed sglang's own argparse, on the host, against launch.json: every flag known,
    and each parsed value the report's (or the inventory's literal override)."""
    if profile.platform != "l40s":
        pytest.skip("not applicable: the sglang-kt engine runs on the L40S platform")
    r = host.run(f"cd /tmp && {launch['python']} -W ignore -c {shlex.quote(_PARSE)}")
    assert r.rc == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["unknown"] == [], f"the installed engine does not know {out['unknown']}"
    parsed = out["parsed"]
    for flag, (dest, want) in _expected_flags(inventory_data).items():
        assert parsed[dest] == want, f"{flag}: the engine parsed {parsed[dest]!r}, the report says {want!r}"
    assert parsed["model_path"] == parsed["kt_weight_path"] == profile.model_path
    assert parsed["api_key"] == "placeholder"


def test_service_environment(host, profile):
    env = host.file("/etc/glm-flash/glm-flash.env").content_string
    assert "HF_HUB_OFFLINE=1" in env
    if profile.platform == "l40s":
        assert f"SGLANG_KT_GLM5_NEXT_FP8_TRANSPORT={profile.kt_transport}" in env
        assert f"CUDA_HOME=/usr/local/cuda-{profile.cuda_version}" in env
        if profile.tp_size > 1:
            assert "expandable_segments" not in env


@pytest.mark.serving
def test_unit_active_and_listening(host, profile):
    assert host.service("glm-flash").is_running
    assert host.socket(f"tcp://{profile.listen_host}:{profile.port}").is_listening


def engine_listeners(host, unit: str = "glm-flash.service") -> list[tuple[str, str, int]]:
    """(protocol, address, port) of every TCP and UDP socket a process of `unit` listens on: ss's
    listeners whose process is in the unit's cgroup (the engine, its TP workers, their NCCL and
    Gloo bootstrap)."""
    cgroup = host.check_output(f"systemctl show -p ControlGroup --value {unit}").strip()
    assert cgroup, f"{unit} has no cgroup: it is not running"
    procs = host.run(f"find /sys/fs/cgroup{shlex.quote(cgroup)} -name cgroup.procs -exec cat {{}} +")
    pids = set(procs.stdout.split())
    found = []
    for line in host.check_output("ss -Htulnp").splitlines():
        fields = line.split()
        if len(fields) < 5 or not pids & set(re.findall(r"pid=(\d+)", line)):
            continue
        address, _, port = fields[4].rpartition(":")
        found.append((fields[0], address.strip("[]"), int(port)))
    return found


def loopback(address: str) -> bool:
    ip, _, interface = address.partition("%")
    return ip.startswith("127.") or ip == "::1" or interface == "lo"


@pytest.mark.serving
def test_the_engine_listens_only_where_the_profile_allows(host, profile):
    """The API on listen_host:port; everything else the engine's processes listen on (NCCL's and
    Gloo's bootstrap between TP ranks, vLLM's own) on loopback only: NCCL_SOCKET_IFNAME and
    GLOO_SOCKET_IFNAME pin them there (roles/service.py tp_env), or NCCL's unauthenticated bootstrap
    would listen on the LAN."""
    found = engine_listeners(host)
    wildcard = profile.listen_host in ("0.0.0.0", "::", "")
    api = [s for s in found if s[2] == profile.port and (wildcard or s[1] == profile.listen_host)]
    assert api, f"the engine's API socket {profile.listen_host}:{profile.port} is not among its listeners {found}"
    wrong = [s for s in found if s not in api and not loopback(s[1])]
    assert not wrong, (
        f"glm-flash.service listens beyond loopback on {wrong}, not only {profile.listen_host}:{profile.port}"
    )


@pytest.mark.serving
def test_a_completion_answers(host, profile):
    out = host.run(
        f"glm-flash-ready --once --host {profile.listen_host} --port {profile.port} --model {profile.served_model_name}"
    )
    assert out.rc == 0, out.stderr


def _gpu_check(host) -> dict[str, dict]:
    """glm-flash-gpu-check run: its probe in a transient unit with glm-flash.service's own properties."""
    r = host.run("glm-flash-gpu-check run --json")
    assert r.stdout.strip(), r.stderr
    return {p["part"]: p for p in json.loads(r.stdout.strip().splitlines()[-1])["parts"]}


def test_the_engines_toolchain_and_syscalls_under_its_unit(host, profile):
    """ninja on the unit's PATH and a compile through its toolkit (flashinfer's JIT builds its
    sampling kernels on the first sampled request), and the syscalls the engine needs beyond
    @system-service, all as the engine gets them. On the sandbox the toolkit is the stand-in's;
    the sandbox's CPU engine (gpu_count 0) compiles no CUDA: its unit sets no toolkit (n/a)."""
    parts = _gpu_check(host)
    assert parts["syscalls"]["state"] == "pass", parts["syscalls"]
    assert parts["toolchain"]["state"] in (("pass", "n/a") if profile.gpu_count == 0 else ("pass",)), parts


@pytest.mark.gpu
def test_gpu_check_passes_under_the_units_properties(host, profile):
    """On a GPU node, every part passes (never n/a): the device nodes open, CUDA runs an FP8
    matmul on each GPU, NCCL all-reduces across the TP ranks, under the engine unit's sandbox."""
    parts = _gpu_check(host)
    for name in ("toolchain", "syscalls", "devices", "cuda"):
        assert parts[name]["state"] == "pass", parts[name]
    assert parts["nccl"]["state"] == ("pass" if profile.tp_size > 1 else "n/a"), parts["nccl"]
    assert parts["cuda"]["detail"].count("GPU ") == profile.gpu_count, parts["cuda"]


def test_without_gpu_the_service_refuses_fast_and_says_why(host, has_gpu, profile):
    if has_gpu:
        pytest.skip("not applicable: this host has a GPU")
    if profile.gpu_count == 0:
        # a profile that needs no GPU (the sandbox's CPU engine) is not refused: it runs without one
        assert host.service("glm-flash").is_running
        this_start = host.check_output("systemctl show -p InvocationID --value glm-flash.service").strip()
        log = host.check_output(f"journalctl _SYSTEMD_INVOCATION_ID={this_start} --no-pager -o cat")
        assert log.strip(), "no journal lines of the running start"
        assert "no NVIDIA driver on this host" not in log, log[-2000:]
        return
    host.run("systemctl reset-failed glm-flash.service")
    start = host.run("timeout 60 systemctl start glm-flash.service")
    assert start.rc != 0
    assert not host.service("glm-flash").is_running
    log = host.check_output("journalctl -u glm-flash.service --no-pager -n 20 -o cat")
    assert "no NVIDIA driver on this host" in log and "cannot start" in log
    host.run("systemctl reset-failed glm-flash.service")


def test_unit_sandboxing_rates_at_most_2(host):
    """`systemd-analyze security`: 9.2 UNSAFE before the sandboxing, 2.0 or less with it."""
    out = host.check_output("systemd-analyze security --no-pager glm-flash.service")
    level = float(re.search(r"Overall exposure level for glm-flash\.service: (\d+\.\d+)", out).group(1))
    assert level <= 2.0, out


def _show(host, unit: str, *props: str) -> dict[str, str]:
    out = host.check_output(f"systemctl show --timestamp=us+utc {unit} " + " ".join(f"-p {p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _what_the_unit_reads_at_start(host) -> set[str]:
    """Listed here from the host's own systemd, not from the deploy's start_inputs: the unit file
    and its drop-ins (and those of the units it requires), the environment files, the credentials,
    every absolute path on an Exec line; what launch.json names (the engine's python through the
    `current` link, the link itself and the patch sets the engine's set dir holds)."""
    show = _show(
        host,
        "glm-flash.service",
        "FragmentPath",
        "DropInPaths",
        "EnvironmentFiles",
        "LoadCredential",
        "ExecStartPre",
        "ExecStart",
        "ExecStartPost",
        "Requires",
    )
    paths = {show["FragmentPath"], *show["DropInPaths"].split()}
    for unit in show["Requires"].split():
        if unit.startswith("glm-flash"):
            req = _show(host, unit, "FragmentPath", "DropInPaths")
            paths |= {req["FragmentPath"], *req["DropInPaths"].split()}
    # EnvironmentFiles=/etc/glm-flash/glm-flash.env (ignore_errors=no)
    paths |= {f.split()[0] for f in re.findall(r"(/\S+) \(ignore_errors=", show["EnvironmentFiles"])}
    # LoadCredential=api-key:/etc/glm-flash/api-key
    paths |= {c.split(":", 1)[1] for c in show["LoadCredential"].split() if ":" in c}
    for prop in ("ExecStartPre", "ExecStart", "ExecStartPost"):
        # { path=/opt/glm-flash/bin/glm-flash-launch ; argv[]=/opt/.../glm-flash-launch /etc/glm-flash/launch.json ; ...}
        for argv in re.findall(r"argv\[\]=([^;]*);", show[prop]):
            paths |= {a for a in argv.split() if a.startswith("/")}
    paths.discard("")
    spec = json.loads(host.file("/etc/glm-flash/launch.json").content_string)
    paths.add(spec["python"])  # through engine/current: the link's own mtime is when it was switched
    current = spec["python"].rsplit("/bin/", 1)[0]
    paths |= {current, f"{current}/glm-flash-patches"}
    paths = {p for p in paths if p != "/bin/sh" and not p.startswith(("/proc/", "/sys/", "/dev/"))}
    return {p for p in paths if host.run(f"test -e {shlex.quote(p)} -o -L {shlex.quote(p)}").rc == 0}


def test_the_reads_at_start_are_listed_from_the_host(host):
    """The list the next check uses is the unit's, as systemd on the host has it."""
    reads = _what_the_unit_reads_at_start(host)
    assert {
        "/etc/systemd/system/glm-flash.service",
        "/etc/glm-flash/glm-flash.env",
        "/etc/glm-flash/launch.json",
    } <= reads
    assert any(p.endswith("/bin/glm-flash-launch") for p in reads)
    assert any(p.endswith("/engine/current") for p in reads)


def test_service_runs_from_what_is_on_disk(host, profile):
    """Its last start (the running engine's, or on a host without GPU the last attempt) came
    after every file it starts from changed, and systemd has the unit on disk loaded: a
    killed deploy left nothing unapplied. What it starts from is read from the host's systemd."""
    reload = host.check_output("systemctl show -p NeedDaemonReload glm-flash.service glm-flash-gpu.service")
    assert "NeedDaemonReload=yes" not in reload
    stamp = _show(host, "glm-flash.service", "InactiveExitTimestamp")["InactiveExitTimestamp"]
    assert stamp, "the service was never started"
    last_start = datetime.strptime(stamp.replace(" UTC", "+0000"), "%a %Y-%m-%d %H:%M:%S.%f%z").timestamp()
    reads = sorted(_what_the_unit_reads_at_start(host))
    quoted = " ".join(shlex.quote(p) for p in reads)
    # the path itself (a link's own mtime), then what it points at
    own = host.check_output(f"stat -c '%.9Y %n' -- {quoted}").splitlines()
    target = host.check_output(f"stat -L -c '%.9Y %n' -- {quoted}").splitlines()
    for line in own + target:
        mtime, path = line.split(" ", 1)
        if path.endswith("/engine/current") and line in target:
            continue  # the environment directory: files are added in it while it is built, before the switch
        assert last_start > float(mtime), f"{path} changed after the service's last start ({stamp})"


@pytest.mark.gpu
def test_gpu_prepared_by_root_before_the_sandboxed_engine(host):
    gpu = host.check_output("systemctl show -p ActiveState -p ConditionResult glm-flash-gpu.service")
    assert "ActiveState=active" in gpu and "ConditionResult=yes" in gpu
    assert host.file("/dev/nvidia-uvm").is_character_device and host.file("/dev/nvidiactl").is_character_device


def test_api_key_not_in_the_journal(host):
    if not host.file("/etc/glm-flash/api-key").exists:
        pytest.skip("not applicable: no API key configured on this host")
    # the key is matched from its root-only file, never put on a command line or in the output
    hits = host.run("journalctl -u glm-flash.service -o cat --no-pager | grep -cF -f /etc/glm-flash/api-key")
    assert hits.stdout.strip() == "0"
