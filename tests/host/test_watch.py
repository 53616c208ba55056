"""Host checks of watching a node (roles/watch.py): the exporters, the GPU collector, the notifier.

On the GPU-less sandbox the collector's file says n/a (no GPU present, collector up); on a GPU
host it must list every GPU the PCI bus has.
"""

from __future__ import annotations

import ipaddress
import json
import shlex

import pytest

from control import layout
from tests.host.conftest import NVIDIA_PCI
from tests.host.test_service import _PARSE


@pytest.fixture(scope="module")
def metrics_on(profile):
    if not profile.metrics:
        pytest.skip("not applicable: metrics is false in the profile")
    return True


def _listen(host, port: int) -> set[str]:
    """The addresses the node exporter itself (its main process) listens on at `port`: only its own
    sockets (the sandbox shares this machine's network with the fleet's, whose exporters use the
    same port on their own addresses)."""
    pid = host.check_output("systemctl show -p MainPID --value prometheus-node-exporter").strip()
    out = host.check_output(f"ss -Hltnp 'sport = :{port}'")
    mine = [line for line in out.splitlines() if f"pid={pid}," in line]
    return {line.split()[3].rsplit(":", 1)[0].strip("[]") for line in mine}


def test_node_exporter_runs_and_listens_only_where_listen_host_allows(host, profile, metrics_on):
    assert host.service("prometheus-node-exporter").is_enabled
    assert host.service("prometheus-node-exporter").is_running
    addresses = _listen(host, profile.node_exporter_port)
    want = profile.listen_host
    if want in ("0.0.0.0", "::"):
        assert addresses, "node-exporter does not listen"
    else:
        assert addresses == {str(ipaddress.ip_address(want)) if want != "localhost" else "127.0.0.1"}, addresses
    drop_in = host.file(layout.NODE_EXPORTER_DROP_IN)
    assert drop_in.user == "root" and drop_in.mode == 0o644
    assert f"--collector.textfile.directory={layout.TEXTFILE_DIR}" in drop_in.content_string


def test_node_exporter_serves_host_and_gpu_collector_metrics(host, profile, metrics_on):
    where = profile.listen_host if profile.listen_host not in ("0.0.0.0", "::") else "127.0.0.1"
    where = f"[{where}]" if ":" in where else where
    out = host.check_output(f"curl -sf http://{where}:{profile.node_exporter_port}/metrics")
    assert "\nnode_memory_MemAvailable_bytes " in out and "\nglm_flash_gpu_present " in out


def test_gpu_collector_runs_and_says_what_it_found(host, metrics_on):
    assert host.service("glm-flash-gpu-metrics.timer").is_enabled
    assert host.service("glm-flash-gpu-metrics.timer").is_running
    prom = host.file(layout.GPU_METRICS_FILE)
    assert prom.exists and prom.mode == 0o644
    text = prom.content_string
    pci = len([line for line in host.check_output(NVIDIA_PCI).splitlines() if line.strip()])
    values = {line.split(" ")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines() if line and line[0] != "#"}
    assert values["glm_flash_gpu_present"] == str(pci)
    up = [v for k, v in values.items() if k.startswith("glm_flash_gpu_collector_up")]
    assert up == ["1"], f"the GPU collector is down: {text}"
    if not pci:
        assert 'reason="no GPU"' in text and "glm_flash_gpu_memory_used_bytes" not in text


def test_notifier_is_installed_and_its_secret_is_roots(host):
    unit = host.file(layout.NOTIFY_UNIT)
    assert unit.exists and unit.user == "root" and unit.mode == 0o644
    out = host.run("systemd-analyze verify glm-flash-notify@glm-flash.service.service 2>&1")
    assert out.rc == 0 and "glm-flash-notify" not in out.stdout, out.stdout
    conf = host.file(layout.NOTIFY_CONF)
    assert conf.user == "root" and conf.mode == 0o644 and "command" in json.loads(conf.content_string)
    hook = host.file(layout.NOTIFY_WEBHOOK)
    if hook.exists:
        assert hook.user == "root" and hook.mode == 0o600
        assert f"LoadCredential=webhook:{layout.NOTIFY_WEBHOOK}" in unit.content_string
    else:
        assert "LoadCredential" not in unit.content_string


@pytest.mark.parametrize("unit", ["glm-flash.service", "glm-flash-gpu.service"])
def test_our_units_name_the_notifier(host, unit):
    show = host.check_output(f"systemctl show {unit} -p OnFailure")
    assert show.strip() == f"OnFailure=glm-flash-notify@{unit}.service"


def test_sglang_parses_enable_metrics(host, profile, metrics_on):
    if profile.platform != "l40s":
        pytest.skip("not applicable: vLLM serves /metrics without a flag")
    python = f"{profile.install_root}/engine/current/bin/python"
    r = host.run(f"cd /tmp && {python} -W ignore -c {shlex.quote(_PARSE)}")
    assert r.rc == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["parsed"]["enable_metrics"] is True
