"""glm-flash.service: installed, enabled, secured, and running where the host can run it."""

import json
import re

import pytest

from roles import engines
from roles.facts.service import ServiceStartState
from roles.service import start_inputs


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


def test_launch_flags_match_the_profile(host, profile):
    spec = json.loads(host.file("/etc/glm-flash/launch.json").content_string)
    numa = int(host.check_output("ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l")) or 1
    assert spec == engines.for_profile(profile).launch_spec(profile, numa)
    assert "--api-key" not in spec["args"], "the key is added by the launcher, never written in the flags"


def test_service_environment(host, profile):
    env = host.file("/etc/glm-flash/glm-flash.env").content_string
    assert "HF_HUB_OFFLINE=1" in env
    if profile.platform == "l40s":
        assert f"SGLANG_KT_GLM5_NEXT_FP8_TRANSPORT={profile.kt_transport}" in env
        assert f"CUDA_HOME=/usr/local/cuda-{profile.cuda_version}" in env
        if profile.tp_size > 1:
            assert "expandable_segments" not in env


@pytest.mark.gpu
def test_unit_active_and_listening(host, profile):
    assert host.service("glm-flash").is_running
    assert host.socket(f"tcp://{profile.listen_host}:{profile.port}").is_listening


@pytest.mark.gpu
def test_a_completion_answers(host, profile):
    out = host.run(f"glm-flash-ready --once --port {profile.port} --model {profile.served_model_name}")
    assert out.rc == 0, out.stderr


def test_without_gpu_the_service_refuses_fast_and_says_why(host, has_gpu):
    if has_gpu:
        pytest.skip("not applicable: this host has a GPU")
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


def test_service_runs_from_what_is_on_disk(host, profile):
    """Its last start (the running engine's, or on a host without GPU the last attempt) came
    after every file it starts from changed, and systemd has the unit on disk loaded: a
    killed deploy left nothing unapplied."""
    cmd = ServiceStartState().command(
        service="glm-flash.service", paths=start_inputs(profile), units=["glm-flash.service", "glm-flash-gpu.service"]
    )
    state = ServiceStartState.parse(host.check_output(cmd.get_raw_value()).splitlines())
    newest, path = state.newest_input
    assert not state.need_daemon_reload
    assert state.last_start > newest, f"{path} changed after the service's last start"


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
