"""Watching a node (roles/watch.py, issue 25): the collector, the notifier, the dashboard, the scrape config.

Simulated here: nvidia-smi (a stand-in script on PATH printing what the real one prints, or
failing as it does without a driver), the PCI bus (a directory shaped like /sys/bus/pci/devices),
systemctl and journalctl for the notifier (stand-ins that answer a unit's state and its lines),
and the webhook (an HTTP server on loopback). The tools themselves run as they do on a host.
"""

from __future__ import annotations

import ast
import grp
import http.server
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from unittest import mock

import jinja2
import pytest

from control import layout
from control.fleet import fleet
from control.profile import ProfileError, build
from roles import watch
from roles.engines.kt import launch
from roles.fleet import gateway
from scripts import dashboard, scrape_config

REPO = Path(__file__).resolve().parents[2]
GPU_TOOL = REPO / "files" / "glm-flash-gpu-metrics"
NOTIFY_TOOL = REPO / "files" / "glm-flash-notify"

# --- the GPU collector --------------------------------------------------------------------------

SMI_OK = (
    "0, GPU-aaaa, NVIDIA L40S, 87, 40, 40000, 46068, 61, 290.5, 2520, 9001, 0, 0\n"
    "1, GPU-bbbb, NVIDIA L40S, 12, 3, 1024, 46068, 44, [N/A], 210, 9001, [N/A], [N/A]\n"
)
# The stand-in prints with the shell's builtin: its PATH holds nothing else (a real nvidia-smi on the
# control machine must not answer for it).
SMI_PRINTS_OK = "printf '%s\\n' " + " ".join(f"'{line}'" for line in SMI_OK.splitlines()) + "\n"
SMI_NO_DRIVER = "NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver."


def stand_in(dir_: Path, name: str, script: str) -> None:
    p = dir_ / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(0o755)


def pci(root: Path, gpus: int) -> Path:
    root.mkdir()
    for i in range(gpus):
        d = root / f"0000:0{i + 1}:00.0"
        d.mkdir()
        (d / "vendor").write_text("0x10de\n")
        (d / "class").write_text("0x030200\n")
    other = root / "0000:00:1f.0"  # an Intel bridge: not a GPU
    other.mkdir()
    (other / "vendor").write_text("0x8086\n")
    (other / "class").write_text("0x060100\n")
    return root


def collect(tmp_path: Path, gpus: int, smi: str | None) -> tuple[int, str, str]:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    if smi is not None:
        stand_in(bin_, "nvidia-smi", smi)
    # The kernel log: two Xid reports since boot (journalctl -k -b --grep 'NVRM: Xid').
    stand_in(
        bin_,
        "journalctl",
        "printf '%s\\n' 'NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus' 'NVRM: Xid (PCI:0000:02:00): 48'\n",
    )
    out = tmp_path / "textfile" / "glm_flash_gpu.prom"
    out.parent.mkdir()
    env = dict(os.environ, PATH=str(bin_), GLM_FLASH_PCI_ROOT=str(pci(tmp_path / "pci", gpus)))
    r = subprocess.run([sys.executable, str(GPU_TOOL), str(out)], env=env, capture_output=True, text=True)
    assert sorted(p.name for p in out.parent.iterdir()) == ["glm_flash_gpu.prom"], "a temporary file was left"
    return r.returncode, out.read_text(), r.stdout + r.stderr


def samples(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_no_gpu_is_reported_as_not_applicable_cleanly(tmp_path):
    rc, text, said = collect(tmp_path, gpus=0, smi=None)
    s = samples(text)
    assert rc == 0, said
    assert s["glm_flash_gpu_present"] == 0 and s['glm_flash_gpu_collector_up{reason="no GPU"}'] == 1
    assert not any(k.startswith("glm_flash_gpu_memory_used_bytes") for k in s)
    assert "n/a" in said


def test_gpus_are_read_per_card_and_na_fields_left_out(tmp_path):
    rc, text, said = collect(tmp_path, gpus=2, smi=SMI_PRINTS_OK)
    s = samples(text)
    assert rc == 0, said
    assert s["glm_flash_gpu_present"] == 2 and s['glm_flash_gpu_collector_up{reason="ok"}'] == 1
    assert s["glm_flash_gpu_xid_errors"] == 2
    assert s['glm_flash_gpu_memory_used_bytes{gpu="0"}'] == 40000 * 1024 * 1024
    assert s['glm_flash_gpu_utilization_ratio{gpu="0"}'] == pytest.approx(0.87)
    assert s['glm_flash_gpu_sm_clock_hertz{gpu="1"}'] == 210e6
    assert s['glm_flash_gpu_power_watts{gpu="0"}'] == 290.5
    assert 'glm_flash_gpu_power_watts{gpu="1"}' not in s  # [N/A]: left out, not 0
    assert s['glm_flash_gpu_ecc_uncorrected_errors{gpu="0"}'] == 0
    assert 'glm_flash_gpu_info{gpu="1",uuid="GPU-bbbb",name="NVIDIA L40S"}' in s


def test_a_broken_driver_is_said_not_passed(tmp_path):
    rc, text, said = collect(tmp_path, gpus=2, smi=f"echo '{SMI_NO_DRIVER}'; exit 9\n")
    s = samples(text)
    assert rc == 1
    assert s['glm_flash_gpu_collector_up{reason="nvidia-smi failed"}'] == 0 and s["glm_flash_gpu_present"] == 2
    assert "nvidia-smi exited 9" in said and "communicate with the NVIDIA driver" in said


def test_a_gpu_without_nvidia_smi_is_a_missing_driver(tmp_path):
    rc, text, said = collect(tmp_path, gpus=1, smi=None)
    assert rc == 1 and samples(text)['glm_flash_gpu_collector_up{reason="no nvidia-smi"}'] == 0
    assert "driver is not installed" in said


def test_the_file_is_replaced_not_rewritten(tmp_path):
    """A scrape never reads half a file: the new content arrives by rename (a new inode)."""
    rc, _, _ = collect(tmp_path, gpus=0, smi=None)
    out = tmp_path / "textfile" / "glm_flash_gpu.prom"
    before = out.stat().st_ino
    env = dict(os.environ, PATH=str(tmp_path / "bin"), GLM_FLASH_PCI_ROOT=str(tmp_path / "pci"))
    subprocess.run([sys.executable, str(GPU_TOOL), str(out)], env=env, check=True, capture_output=True)
    assert out.stat().st_ino != before and stat.S_IMODE(out.stat().st_mode) == 0o644


# --- the notifier -------------------------------------------------------------------------------


class Hook(http.server.BaseHTTPRequestHandler):
    posts: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.posts.append((self.path, json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook():
    Hook.posts = []
    server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/hooks/s3cr3t-token", Hook.posts
    server.shutdown()


def notify(
    tmp_path: Path,
    unit: str,
    sub_state: str,
    active: str,
    url: str = "",
    command: bool = True,
    journal: str = "",
    invocation: str = "",
):
    # The command runs as nobody: its script and its sink sit where nobody can reach them (pytest's tmp is root's 0700).
    shared = Path(tempfile.mkdtemp(prefix="glm-flash-notify-test-", dir="/tmp"))
    shared.chmod(0o755)
    bin_ = shared / "bin"
    bin_.mkdir(exist_ok=True)
    stand_in(
        bin_,
        "systemctl",
        f"echo ActiveState={active}; echo SubState={sub_state}; echo Result=exit-code; echo NRestarts=2\n",
    )
    stand_in(bin_, "journalctl", journal or journal_json(*(f"line {i} of {unit}" for i in (1, 2, 3))))
    sink = shared / "sink"
    sink.mkdir(exist_ok=True)
    sink.chmod(0o777)  # the command runs as nobody
    stand_in(bin_, "sink", f'{{ echo "args: $*"; cat; }} >> {sink}/told; chmod 644 {sink}/told\n')
    conf = tmp_path / "notify.json"
    conf.write_text(watch.notify_settings([str(bin_ / "sink")] if command else [], 3))
    creds = tmp_path / "creds"
    creds.mkdir(exist_ok=True)
    if url:
        (creds / "webhook").write_text(url + "\n")
    env = dict(
        os.environ,
        PATH=f"{bin_}:/usr/bin:/bin",
        GLM_FLASH_NOTIFY_CONF=str(conf),
        GLM_FLASH_NOTIFY_STATE=str(tmp_path / "state"),
        CREDENTIALS_DIRECTORY=str(creds),
        MONITOR_INVOCATION_ID=invocation,
    )
    bin_.chmod(0o755)
    try:
        r = subprocess.run([sys.executable, str(NOTIFY_TOOL), unit], env=env, capture_output=True, text=True)
        record = json.loads((tmp_path / "state" / "last-failure.json").read_text())
        st = (tmp_path / "state" / "last-failure.json").stat()
        record["_mode"], record["_group"] = st.st_mode & 0o777, grp.getgrgid(st.st_gid).gr_name
        told = (sink / "told").read_text() if (sink / "told").exists() else ""
    finally:
        shutil.rmtree(shared)
    return r, record, told


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the command runs as nobody: the test needs root")
T0 = 1764888000  # 2025-12-04T22:40:00Z: the stand-in journal's first entry


def journal_json(*messages: str, ids: tuple[str, ...] = ()) -> str:
    """A stand-in journalctl printing entries as `journalctl -o json` does (each of a unit's output
    lines from glm-flash-launch[42]); ids[i], when given and not empty, is entry i's invocation."""
    out = []
    for i, message in enumerate(messages):
        entry = {"__CURSOR": f"s=1;i={i}", "__REALTIME_TIMESTAMP": str((T0 + i) * 10**6), "_HOSTNAME": "gpu1"}
        entry |= {"SYSLOG_IDENTIFIER": "glm-flash-launch", "_PID": "42", "MESSAGE": message}
        if i < len(ids) and ids[i]:
            entry["_SYSTEMD_INVOCATION_ID"] = ids[i]
        out.append(json.dumps(entry))
    return "cat <<'EOF'\n" + "\n".join(out) + "\nEOF\n"


def said(lines: list[str]) -> list[str]:
    """The messages of short-iso lines, each checked for its `TIME HOST IDENT[PID]: ` head."""
    for line in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} gpu1 glm-flash-launch\[42\]: .*", line), line
    return [line.split("]: ", 1)[1] for line in lines]


@needs_root
def test_a_unit_systemd_restarts_is_recorded_without_word(tmp_path, webhook):
    url, posts = webhook
    r, record, told = notify(tmp_path, "glm-flash.service", "auto-restart", "activating", url)
    assert r.returncode == 0 and "no word yet" in r.stdout
    assert record["unit"] == "glm-flash.service" and record["restarting"] is True
    assert said(record["lines"]) == [f"line {i} of glm-flash.service" for i in (1, 2, 3)]
    assert told == "" and posts == []


@needs_root
def test_the_failed_runs_lines_are_its_own_and_those_journald_could_not_tag(tmp_path):
    """A start refused at once writes lines journald tags with no invocation (the command had ended
    before journald read them): they are the failed run's too, from its first tagged line on.
    Another run's lines are not, nor an untagged line before the run began."""
    mine, other = "0" * 31 + "a", "0" * 31 + "b"
    journal = journal_json(
        "untagged, an earlier run's",
        "before, another run",
        "mine",
        "untagged: why it stopped",
        "after, another run",
        ids=("", other, mine, "", other),
    )
    _, record, _ = notify(
        tmp_path, "glm-flash.service", "failed", "failed", command=False, journal=journal, invocation=mine
    )
    assert said(record["lines"]) == ["mine", "untagged: why it stopped"]
    _, record, _ = notify(tmp_path, "glm-flash.service", "failed", "failed", command=False, journal=journal)
    assert said(record["lines"]) == ["mine", "untagged: why it stopped", "after, another run"]  # the last 3 (lines: 3)


@needs_root
def test_lines_journald_stores_after_the_sync_are_waited_for(tmp_path):
    """A journald too busy to accept the unit's output connection before the unit ended stores its
    lines after the notifier's first sync (a cold CI run's record held systemd's lines only): while
    only systemd's own lines (PID 1) are there, the notifier asks again. Here the stand-in journal
    shows the unit's line from its third read on."""
    mine = "0" * 31 + "a"
    systemd = {"__CURSOR": "s=1;i=0", "__REALTIME_TIMESTAMP": str(T0 * 10**6), "_HOSTNAME": "gpu1"}
    systemd |= {"SYSLOG_IDENTIFIER": "systemd", "_PID": "1", "MESSAGE": "Starting x", "INVOCATION_ID": mine}
    own = {"__CURSOR": "s=1;i=1", "__REALTIME_TIMESTAMP": str((T0 + 1) * 10**6), "_HOSTNAME": "gpu1"}
    own |= {"SYSLOG_IDENTIFIER": "sh", "_PID": "42", "MESSAGE": "why it failed"}
    reads = tmp_path / "reads"
    journal = (
        '[ "$1" = --sync ] && exit 0\n'
        f"n=$(cat {reads} 2>/dev/null || echo 0); echo $((n + 1)) > {reads}\n"
        f"echo '{json.dumps(systemd)}'\n"
        f"[ $n -ge 2 ] && echo '{json.dumps(own)}'\n"
        "exit 0\n"
    )
    _, record, _ = notify(
        tmp_path, "glm-flash.service", "failed", "failed", command=False, journal=journal, invocation=mine
    )
    assert [line.split(" ", 2)[2] for line in record["lines"]] == ["systemd[1]: Starting x", "sh[42]: why it failed"]
    assert reads.read_text().strip() == "3"


@needs_root
def test_a_unit_that_gave_up_is_told_once_to_command_and_webhook(tmp_path, webhook):
    url, posts = webhook
    r, record, told = notify(tmp_path, "glm-flash.service", "failed", "failed", url)
    assert r.returncode == 0, r.stdout + r.stderr
    assert told.startswith("args: glm-flash.service\nglm-flash.service failed on ")
    assert "glm-flash-launch[42]: line 3 of glm-flash.service" in told
    assert len(posts) == 1 and posts[0][0] == "/hooks/s3cr3t-token"
    body = posts[0][1]
    assert body["unit"] == "glm-flash.service" and said(body["lines"])[-1] == "line 3 of glm-flash.service"
    assert "glm-flash.service failed" in body["text"]
    assert "s3cr3t" not in r.stdout + r.stderr  # the URL (its secret) is never printed


@needs_root
def test_engine_written_markup_reaches_the_channel_inert_and_the_record_is_not_world_readable(tmp_path, webhook):
    """#36 L3: the failed unit's journal lines are its own words (a hostile engine writes them):
    Slack's <!channel> and <url|text>, Mattermost's @channel, links and images, a backtick fence
    to break out of the code block: none of it renders. The record is 0640 root:adm."""
    url, posts = webhook
    hostile = [
        "<!channel> rotate keys at <https://evil.example/x|the console> @all [this](https://evil.example) ![i](x.png)",
        "```",
        "@here outside the fence?",
    ]
    r, record, _ = notify(
        tmp_path, "glm-flash.service", "failed", "failed", url, command=False, journal=journal_json(*hostile)
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert said(record["lines"]) == hostile  # the record keeps what the journal said
    assert (record["_mode"], record["_group"]) == (0o640, "adm")
    text = posts[0][1]["text"]
    head, fence, rest = text.partition("\n```\n")
    assert fence and rest.endswith("\n```") and rest[: -len("\n```")].count("`") == 0, text
    assert "<" not in rest and ">" not in rest and "&lt;!channel&gt;" in rest and "&lt;https://evil.example/x|" in rest
    assert "@here outside the fence?" in rest  # inside the block, where no mention is rendered


@needs_root
def test_a_dead_webhook_is_said_without_its_url(tmp_path):
    r, record, _ = notify(
        tmp_path,
        "glm-flash-job-engine-build.service",
        "failed",
        "failed",
        "http://127.0.0.1:9/hooks/s3cr3t-token",
        command=False,
    )
    assert r.returncode == 1 and "could not tell: webhook (" in r.stdout
    assert "s3cr3t" not in r.stdout + r.stderr and record["unit"] == "glm-flash-job-engine-build.service"


# --- the deploy's side --------------------------------------------------------------------------


def constants(tool: Path) -> dict[str, str]:
    """A tool's module-level paths: literals, and the shared module's (`host.NAME`, files/glm_flash_host.py)."""
    import glm_flash_host

    out = {}
    for node in ast.parse(tool.read_text()).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            v = node.value
            if isinstance(v, ast.Call) and getattr(v.func, "attr", "") == "get" and len(v.args) == 2:
                v = v.args[1]
            if isinstance(v, ast.Attribute) and getattr(v.value, "id", "") == "host":
                out[node.targets[0].id] = getattr(glm_flash_host, v.attr)
            elif isinstance(v, ast.Constant) and isinstance(v.value, str):
                out[node.targets[0].id] = v.value
    return out


def test_host_tools_carry_layouts_paths():
    notify_c = constants(NOTIFY_TOOL)
    assert notify_c["CONF"] == layout.NOTIFY_CONF and notify_c["STATE"] == layout.NOTIFY_STATE
    assert f"{notify_c['STATE']}/{notify_c['RECORD']}" == layout.LAST_FAILURE
    assert constants(REPO / "files" / "glm-flash")["LAST_FAILURE"] == layout.LAST_FAILURE
    assert constants(REPO / "files" / "glm-flash")["GPU_METRICS_FILE"] == layout.GPU_METRICS_FILE


def test_sglang_gets_enable_metrics_only_when_metrics_are_on():
    assert "--enable-metrics" in launch.kt_args(build("gpu1", {}), 2)
    assert "--enable-metrics" not in launch.kt_args(build("gpu1", {"metrics": False}), 2)


def test_node_exporter_listens_only_where_the_api_does():
    text = watch.node_exporter_drop_in(build("gpu1", {}))
    assert "ExecStart=\nExecStart=/usr/bin/prometheus-node-exporter --web.listen-address=127.0.0.1:9100 " in text
    assert f"--collector.textfile.directory={layout.TEXTFILE_DIR}\n" in text
    six = build("gpu1", {"listen_host": "::1", "node_exporter_port": 9200})
    assert "--web.listen-address=[::1]:9200 " in watch.node_exporter_drop_in(six)


@pytest.mark.parametrize(
    "template", ["glm-flash.service.j2", "glm-flash-gpu.service.j2", "glm-flash-gateway.service.j2"]
)
def test_units_of_ours_say_when_they_fail(template):
    text = (layout.TEMPLATES / template).read_text()
    unit_section = text.split("[Service]")[0]
    assert "\nOnFailure=glm-flash-notify@%n.service\n" in unit_section


def test_the_notifier_unit_loads_the_webhook_as_a_credential_only():
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(layout.TEMPLATES), undefined=jinja2.StrictUndefined)
    t = env.get_template("glm-flash-notify@.service.j2")
    with_hook = t.render(tool="/x/glm-flash-notify", state_directory="glm-flash-notify", webhook=layout.NOTIFY_WEBHOOK)
    assert f"LoadCredential=webhook:{layout.NOTIFY_WEBHOOK}\n" in with_hook
    assert "ExecStart=/x/glm-flash-notify %i\n" in with_hook and not re.search("^OnFailure=", with_hook, re.M)
    assert "LoadCredential" not in t.render(tool="/x/n", state_directory="s", webhook="")


def test_the_long_jobs_name_their_notifier_in_full():
    text = (REPO / "files" / "glm-flash-job").read_text()
    assert 'f"--property=OnFailure={NOTIFY_TEMPLATE}{unit(name)}.service"' in text
    assert constants(REPO / "files" / "glm-flash-job")["NOTIFY_TEMPLATE"] == "glm-flash-notify@"


def test_notify_command_words_are_shape_checked():
    assert build("gpu1", {"notify_command": ["/usr/local/bin/page-me", "--team=ml"]}).notify_command[0].startswith("/")
    with pytest.raises(ProfileError, match="notify_command"):
        build("gpu1", {"notify_command": ["/bin/sh", "-c", "curl $HOOK"]})


def test_webhook_url_shape_is_checked_without_showing_it(monkeypatch, capsys):
    monkeypatch.setenv("HOOK", "https://hooks.example/s3cr3t\nX-Injected: 1")
    with mock.patch("control.profile.current_host") as h, pytest.raises(SystemExit):
        h.name = "gpu1"
        watch.webhook_secret("HOOK")
    said = capsys.readouterr()
    assert "notify_webhook_env" in said.err and "s3cr3t" not in said.err + said.out
    monkeypatch.setenv("HOOK", "https://hooks.example/s3cr3t")
    assert "s3cr3t" not in repr(watch.webhook_secret("HOOK"))


def test_the_router_serves_its_metrics_where_its_api_listens():
    p = build_gateway()
    args = gateway.router_args(p)
    assert args[args.index("--prometheus-host") + 1] == "127.0.0.1"
    assert args[args.index("--prometheus-port") + 1] == "29000"


def build_gateway():
    from control.fleet import gateway_profile

    return gateway_profile("gw", {"gateway_listen_host": "127.0.0.1", "gateway_workers": ["http://10.0.0.1:30000"]})


# --- scrape config ------------------------------------------------------------------------------


def test_scrape_config_of_a_fleet_names_engines_exporters_and_the_router(monkeypatch):
    monkeypatch.setenv("GLM_FLASH_API_KEY", "k")
    monkeypatch.setenv("GLM_FLASH_WORKER_KEY", "worker-key-0123456789")
    ssh = {"ssh_user": "root"}
    workers, gw = fleet(
        shared={"listen_host": "0.0.0.0", "model_revision": "1" * 40, "fleet_network_private": True},
        workers=[
            ("w1", {**ssh, "ssh_hostname": "10.0.0.1"}),
            ("w2", {**ssh, "ssh_hostname": "10.0.0.2", "metrics": False}),
        ],
        gateway=("gw", {**ssh, "ssh_hostname": "10.0.0.9", "gateway_listen_host": "10.0.0.9"}),
    )
    cfg = scrape_config.config({"workers": workers, "gateway": gw, "other": [1, 2]})
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in cfg["scrape_configs"]}
    assert jobs == {
        "glm-flash-engine": ["10.0.0.1:30000", "10.0.0.2:30000"],
        "glm-flash-node": ["10.0.0.1:9100"],  # w2: metrics false
        "glm-flash-gateway": ["10.0.0.9:29000"],
    }
    # The engines' colon names survive only the text format (tests/sandbox/test_prometheus_scrape.py).
    protocols = {j["job_name"]: j.get("scrape_protocols") for j in cfg["scrape_configs"]}
    assert protocols["glm-flash-engine"] == ["PrometheusText0.0.4"] and protocols["glm-flash-node"] is None


def test_scrape_config_of_one_loopback_node():
    cfg = scrape_config.config({"hosts": [("gpu1", {"ssh_hostname": "192.0.2.7"})]})
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in cfg["scrape_configs"]}
    assert jobs == {"glm-flash-engine": ["127.0.0.1:30000"], "glm-flash-node": ["127.0.0.1:9100"]}


# --- the dashboard ------------------------------------------------------------------------------

DASHBOARD = REPO / "dashboards" / "glm-flash.json"
# Grafana's dashboard JSON model, the part a dashboard file must get right to load
# (https://grafana.com/docs/grafana/latest/dashboards/build-dashboards/view-dashboard-json-model/).
SCHEMA = {
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "title": {"type": "string", "minLength": 1},
        "uid": {"type": "string", "pattern": r"^[A-Za-z0-9_-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 16},
        "refresh": {"type": "string"},
        "time": {"type": "object", "required": ["from", "to"]},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": {"type": "object", "required": ["name", "type"]}}},
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "type", "title", "gridPos", "targets", "datasource"],
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "type": {"type": "string", "enum": ["timeseries", "stat", "gauge", "table"]},
                    "title": {"type": "string", "minLength": 1},
                    "gridPos": {
                        "type": "object",
                        "required": ["h", "w", "x", "y"],
                        "properties": {
                            "h": {"type": "integer", "minimum": 1},
                            "w": {"type": "integer", "minimum": 1, "maximum": 24},
                            "x": {"type": "integer", "minimum": 0, "maximum": 23},
                            "y": {"type": "integer", "minimum": 0},
                        },
                    },
                    "targets": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["refId", "expr"],
                            "properties": {
                                "refId": {"type": "string", "pattern": "^[A-Z]$"},
                                "expr": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
    },
}


def check(value, schema, where="$") -> list[str]:
    """The JSON Schema keywords SCHEMA uses (type, required, properties, items, enum, bounds, pattern)."""
    kinds = {"object": dict, "array": list, "string": str, "integer": int}
    problems = []
    kind = schema.get("type")
    if kind and (not isinstance(value, kinds[kind]) or (kind == "integer" and isinstance(value, bool))):
        return [f"{where}: not {kind}"]
    for key in schema.get("required", []):
        if key not in value:
            problems.append(f"{where}: {key} missing")
    for key, sub in schema.get("properties", {}).items():
        if isinstance(value, dict) and key in value:
            problems += check(value[key], sub, f"{where}.{key}")
    if "items" in schema:
        for i, v in enumerate(value):
            problems += check(v, schema["items"], f"{where}[{i}]")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} not in {schema['enum']}")
    if "minimum" in schema and value < schema["minimum"] or "maximum" in schema and value > schema["maximum"]:
        problems.append(f"{where}: {value} out of bounds")
    if (
        "minLength" in schema
        and len(value) < schema["minLength"]
        or "minItems" in schema
        and len(value) < schema["minItems"]
    ):
        problems.append(f"{where}: too short")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        problems.append(f"{where}: {value!r} does not match {schema['pattern']}")
    return problems


def test_the_schema_check_can_fail():
    bad = json.loads(DASHBOARD.read_text())
    bad["panels"][0]["gridPos"]["w"] = 30
    del bad["panels"][1]["targets"][0]["expr"]
    assert len(check(bad, SCHEMA)) == 2


def test_dashboard_loads_and_matches_its_generator():
    data = json.loads(DASHBOARD.read_text())
    assert check(data, SCHEMA) == []
    assert DASHBOARD.read_text() == dashboard.render(), "dashboards/glm-flash.json is stale: run `make dashboard`"
    ids = [p["id"] for p in data["panels"]]
    assert len(ids) == len(set(ids))
    titles = " | ".join(p["title"] for p in data["panels"])
    for measured in (
        "Decode tok/s per stream",
        "Decode tok/s total",
        "Prefill tok/s",
        "Time to first token",
        "Queue length",
        "KV-cache use",
        "Spec-decode acceptance",
        "GPU memory per card",
        "Host memory",
    ):
        assert measured in titles


# Every metric a panel names, and where it comes from. "scrape": the sandbox's Prometheus scraped it
# from the deployed node (tests/sandbox/test_prometheus_scrape.py checks that list); the others are
# documented by their engine.
SGLANG = "sglang-kt 0.7.0.post1 wheel, sglang/srt/observability/metrics_collector.py (the engine_set's wheel)"
VLLM = "https://docs.vllm.ai/en/stable/usage/metrics/ and docs/design/metrics.md (v1 metrics)"
ROUTER = "sglang-router 0.3.2 wheel (locks/gateway.txt), strings of sglang_router_rs.abi3.so"
COLLECTOR = "files/glm-flash-gpu-metrics (ours; with GPUs, tested above with an nvidia-smi stand-in)"
DOCUMENTED = {
    "sglang:inter_token_latency_seconds": SGLANG,
    "sglang:generation_tokens_total": SGLANG,
    "sglang:prompt_tokens_total": SGLANG,
    "sglang:time_to_first_token_seconds": SGLANG,
    "sglang:num_queue_reqs": SGLANG,
    "sglang:num_running_reqs": SGLANG,
    "sglang:token_usage": SGLANG,
    "sglang:spec_accept_length": SGLANG,
    "vllm:inter_token_latency_seconds": VLLM,
    "vllm:generation_tokens_total": VLLM,
    "vllm:prompt_tokens_total": VLLM,
    "vllm:time_to_first_token_seconds": VLLM,
    "vllm:num_requests_waiting": VLLM,
    "vllm:num_requests_running": VLLM,
    "vllm:kv_cache_usage_perc": VLLM,
    "vllm:spec_decode_num_accepted_tokens_total": VLLM,
    "vllm:spec_decode_num_drafts_total": VLLM,
    "smg_http_requests_total": ROUTER,
    "smg_worker_pool_size": ROUTER,
    "glm_flash_gpu_memory_used_bytes": COLLECTOR,
    "glm_flash_gpu_memory_total_bytes": COLLECTOR,
    "glm_flash_gpu_utilization_ratio": COLLECTOR,
    "glm_flash_gpu_temperature_celsius": COLLECTOR,
    "glm_flash_gpu_power_watts": COLLECTOR,
    "glm_flash_gpu_sm_clock_hertz": COLLECTOR,
    "glm_flash_gpu_memory_clock_hertz": COLLECTOR,
    "glm_flash_gpu_ecc_corrected_errors": COLLECTOR,
    "glm_flash_gpu_ecc_uncorrected_errors": COLLECTOR,
}
# Scraped from the GPU-less sandbox by tests/sandbox/test_prometheus_scrape.py (node-exporter, the collector's n/a).
SCRAPED_IN_SANDBOX = {
    "node_memory_MemAvailable_bytes",
    "node_memory_MemTotal_bytes",
    "node_cpu_seconds_total",
    "glm_flash_gpu_xid_errors",
    "glm_flash_gpu_collector_up",
    "glm_flash_gpu_present",
}
PROMQL_WORDS = {"sum", "by", "rate", "avg", "histogram_quantile", "le", "instance", "gpu", "mode", "job", "idle"}


def panel_metrics() -> set[str]:
    names = set()
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        for t in p["targets"]:
            expr = re.sub(r'"[^"]*"', '""', t["expr"])  # label values
            expr = re.sub(r"\[[0-9]+[smh]\]", "", expr)
            for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
                if word not in PROMQL_WORDS:
                    names.add(
                        re.sub(r"_(bucket|sum|count)$", "", word)
                        if word.endswith(("_bucket", "_sum", "_count"))
                        else word
                    )
    return names


def test_every_panel_names_a_metric_scraped_or_documented():
    unknown = panel_metrics() - set(DOCUMENTED) - SCRAPED_IN_SANDBOX
    assert not unknown, f"panel queries name metrics nobody scraped or documented: {sorted(unknown)}"


def test_the_collector_writes_every_gpu_metric_the_dashboard_names(tmp_path):
    _, text, _ = collect(tmp_path, gpus=2, smi=SMI_PRINTS_OK)
    written = {re.split(r"[{ ]", line)[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert {m for m in panel_metrics() if m.startswith("glm_flash_gpu_")} <= written


def test_sglang_defines_the_metrics_the_dashboard_names():
    """Against the engine's own wheel: sglang-kt of the default engine set, fetched into the
    control machine's cache when it is not there yet (sha256 checked against the lock), never
    skipped."""
    from control.defaults import KNOBS
    from control.engine_lock import fetch, load_lock, pin_of

    _, pins = load_lock(KNOBS["engine_set"].default)
    (whl,) = fetch([pin_of(pins, "sglang-kt")])
    with zipfile.ZipFile(whl) as z:
        # the module pip installs (the wheel also carries stale build/lib/... copies of it)
        text = z.read("sglang/srt/observability/metrics_collector.py").decode(errors="replace")
    for name in (m for m in DOCUMENTED if m.startswith("sglang:")):
        assert f'name="{name}"' in text, name


# --- glm-flash status: the last failure ----------------------------------------------------------


def test_status_shows_the_last_failure_with_its_lines(tmp_path):
    from tests.unit.test_status_tool import _load

    st = _load()
    assert st.decide_last_failure(None)["detail"] == "none recorded"
    path = tmp_path / "last-failure.json"
    record = {
        "unit": "glm-flash.service",
        "time": "T",
        "result": "start-limit-hit",
        "restarting": False,
        "word_to": ["webhook"],
        "lines": [f"line {i}" for i in range(30)],
    }
    path.write_text(json.dumps(record))
    it = st.decide_last_failure(st.load_last_failure(str(path)))
    assert it["state"] == "ok" and it["lines"][-1] == "line 29"
    assert it["detail"].startswith(
        "glm-flash.service failed at T (start-limit-hit), it stayed failed; word went to the webhook"
    )
    assert it["detail"].endswith("line 25 | line 26 | line 27 | line 28 | line 29")
    path.write_text("{half")
    assert st.load_last_failure(str(path)) is None
    # The engine's own error line, wherever it is among the lines, not systemd's nor readiness's.
    record["lines"] = [
        "2026-12-04T14:00:00+0000 sandbox glm-flash-launch[7]: ValueError: User-specified max_model_len (65536) is too big",
        "2026-12-04T14:00:01+0000 sandbox glm-flash-ready[9]: glm-flash: the engine (pid 7) exited: HTTPError",
        *(
            f"2026-12-04T14:00:02+0000 sandbox systemd[1]: glm-flash.service: Failed with result 'exit-code' {i}"
            for i in range(6)
        ),
    ]
    detail = st.decide_last_failure(record)["detail"]
    assert detail.endswith("the engine's error: " + record["lines"][0]), detail
    record["lines"] = record["lines"][1:]
    assert "the engine's error" not in st.decide_last_failure(record)["detail"]
    record["lines"] = [  # pydantic's error line, then the reason on an indented line of its own
        "T sandbox glm-flash-launch[7]: pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig",
        "T sandbox glm-flash-launch[7]:   Value error, User-specified max_model_len (65536) is greater",
        "T sandbox glm-flash-launch[7]:     For further information visit https://errors.pydantic.dev",
        "T sandbox systemd[1]: glm-flash.service: Failed with result 'exit-code'.",
    ]
    assert st.decide_last_failure(record)["detail"].endswith(
        "ValidationError: 1 validation error for ModelConfig Value error, User-specified max_model_len (65536) is greater"
    )


def test_status_says_whether_the_node_can_be_watched(tmp_path):
    from tests.unit.test_status_tool import _load

    st = _load()
    assert st.decide_metrics({"metrics": False}, "", None)["state"] == "n/a"
    down = st.decide_metrics({"metrics": True}, "failed", None)
    assert down["state"] == "problem" and "prometheus-node-exporter.service is failed" in down["detail"]
    assert st.decide_metrics({"metrics": True}, "active", None)["state"] == "problem"
    _, na, _ = collect(tmp_path, gpus=0, smi=None)
    assert st.decide_metrics({"metrics": True}, "active", na)["detail"].endswith("GPU collector: no GPU (n/a)")
    broken = st.decide_metrics(
        {"metrics": True}, "active", na.replace('reason="no GPU"} 1', 'reason="nvidia-smi failed"} 0')
    )
    assert broken["state"] == "problem" and "(nvidia-smi failed)" in broken["detail"]


def test_the_summary_names_the_model_clients_send_beside_the_endpoint():
    """A client needs both: the OpenAI base URL and the served model name (issue 39)."""
    from roles.summary import render

    s = {
        "result": "deployed",
        "refused": [],
        "skipped": [],
        "endpoint": "http://gpu1.lan:30000/v1",
        "model_name": "glm-5.3-flash",
    }
    lines = render({"gpu1.lan": s}).splitlines()
    at = lines.index("        endpoint: http://gpu1.lan:30000/v1")
    assert lines[at + 1] == "        model_name: glm-5.3-flash"
