"""Watching a node: host and GPU metrics for Prometheus, and word when a unit of ours fails.

Metrics (`metrics`, on by default; docs/observability.md says why):
- the engine's own /metrics on the API's address and port (SGLang-kt: --enable-metrics in the
  launch spec, checked on its own parser like every flag; vLLM serves it unasked). Neither
  engine puts /metrics behind the API key (sglang's auth middleware lets /health and /metrics
  through; vLLM's guards /v1 only: docs/sources.md), so it is reachable exactly where the API is;
- Debian's prometheus-node-exporter for the host, its command line replaced by a drop-in of ours
  (written before the package is installed, so the package's first start already listens only
  on listen_host:node_exporter_port) that also points its textfile collector at our directory;
- the GPUs through that textfile collector: glm-flash-gpu-metrics.timer runs
  files/glm-flash-gpu-metrics every gpu_metrics_interval_s, which writes glm_flash_gpu.prom
  atomically from `nvidia-smi --query-gpu`. No GPU: it says n/a (glm_flash_gpu_present 0,
  collector up); a GPU nvidia-smi cannot read: collector down and the unit failed.

Word on failure (always installed, on workers and the gateway alike):
- glm-flash-notify@.service, started by OnFailure= of the engine, its GPU setup, the gateway
  and the long jobs (files/glm-flash-job), runs files/glm-flash-notify: it records the failure
  with its journal lines for `glm-flash status` and, once the unit gave up (not while systemd
  restarts it), runs notify_command and posts to the webhook;
- the webhook URL comes from the control machine's environment (notify_webhook_env) and is
  handled like the API key: a root-only file written through a root-only staging directory
  (roles/operations/secrets.py), read by the notifier as a systemd credential; never in argv,
  the journal or a file others can read.
Failure mode: a unit's failure while the notifier's command or webhook is down is still recorded
(the notifier unit then shows failed); a metrics endpoint nobody scrapes costs nothing.
"""

from __future__ import annotations

import json
import os
import re
from io import StringIO

from control import layout
from control.profile import Profile, refuse
from control.report import skipped
from roles.operations import packages, paths, sandboxing, units
from roles.operations.secrets import Secret, secret_file
from roles.operations.service_restart import started_from_disk
from roles.operations.uploads import host_tool, template

NODE_EXPORTER = "prometheus-node-exporter.service"
GPU_METRICS = "glm-flash-gpu-metrics"
NOTIFY_TOOL = "glm-flash-notify"
WEBHOOK_RE = re.compile(r"https?://[^\s]+")


def notify_unit(unit: str) -> str:
    """The notifier's instance for `unit` where no specifier is expanded (systemd-run's properties)."""
    return f"glm-flash-notify@{unit}.service"


def listen_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# What every transient unit of ours takes (roles/operations/sandboxing.py), but the system-call filter
# (node-exporter 1.9 is killed, SIGSYS, under ~@privileged @resources) and ProtectClock= (its timex
# collector reads the clock's state with adjtimex); /home read-only, not hidden (its filesystem
# collector measures every mount point); netlink for its network collectors.
NODE_EXPORTER_SANDBOX = (
    *(p for p in sandboxing.COMMON if not p.startswith(("SystemCallFilter=", "ProtectClock="))),
    "ProtectHome=read-only",
    "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK",
    "MemoryDenyWriteExecute=yes",
)


def node_exporter_drop_in(profile: Profile) -> str:
    argv = [
        layout.NODE_EXPORTER,
        f"--web.listen-address={listen_address(profile.listen_host, profile.node_exporter_port)}",
        f"--collector.textfile.directory={layout.TEXTFILE_DIR}",
    ]
    return (
        "# glm-flash: host metrics where listen_host allows (roles/watch.py). Owned by the deploy.\n"
        "# Replaces the package's command line (the $ARGS of the package's defaults file is not read).\n"
        "[Service]\n"
        "ExecStart=\n"
        f"ExecStart={' '.join(argv)}\n" + "".join(f"{line}\n" for line in NODE_EXPORTER_SANDBOX)
        # It only reads /proc, /sys, mount points and the textfile directory, and answers scrapes:
        # the package's unit sandboxes nothing (9.2 in systemd-analyze security; 3.2 with these).
    )


def notify_settings(command: list[str], lines: int) -> str:
    return json.dumps({"command": list(command), "lines": int(lines)}, indent=1, sort_keys=True) + "\n"


def webhook_secret(env_name: str) -> Secret | None:
    """The webhook URL from the control machine's environment, its shape checked without showing it."""
    url = os.environ.get(env_name, "")
    if not url:
        return None
    if not WEBHOOK_RE.fullmatch(url):
        refuse(
            "notify_webhook_env",
            f"{env_name} is not an http:// or https:// URL on one line (its value is not shown)",
            f"export {env_name}=https://... or unset it",
        )
    return Secret(url)


def notifier(command: list[str], lines: int, webhook_env: str) -> None:
    """The notifier, its settings and its webhook secret: workers (apply) and the gateway (roles/fleet/gateway.py)."""
    paths.directory(layout.NOTIFY_TOOL_DIR, mode="755", name="Notifier directory")
    host_tool(NOTIFY_TOOL, layout.NOTIFY_TOOL_DIR)
    paths.directory(layout.NOTIFY_CONF_DIR, user="root", group="root", mode="755", name="Notifier settings")
    paths.put(
        StringIO(notify_settings(command, lines)),
        layout.NOTIFY_CONF,
        user="root",
        group="root",
        mode="644",
        name="Notifier settings (command, journal lines)",
    )
    secret = webhook_secret(webhook_env)
    if secret:
        secret_file(
            name="Notifier webhook (from the control machine's environment; compared by hash, never shown)",
            secret=secret,
            dest=layout.NOTIFY_WEBHOOK,
            stage_dir=layout.NOTIFY_STAGE_DIR,
        )
    else:
        paths.absent(layout.NOTIFY_WEBHOOK, name="No notifier webhook configured")
    template(
        "glm-flash-notify@.service.j2",
        layout.NOTIFY_UNIT,
        name="glm-flash-notify@.service unit",
        tool=f"{layout.NOTIFY_TOOL_DIR}/{NOTIFY_TOOL}",
        state_directory=layout.NOTIFY_STATE.removeprefix("/var/lib/"),
        webhook=layout.NOTIFY_WEBHOOK if secret else "",
    )
    units.loaded([notify_unit("glm-flash.service")], name="systemd holds the notifier unit as on disk")


def metrics(profile: Profile) -> None:
    paths.directory(layout.TEXTFILE_DIR, user="root", group="root", mode="755", name="Textfile collector directory")
    # The drop-in before the package: its first start listens only where listen_host allows.
    paths.directory(layout.NODE_EXPORTER_DROP_IN.rsplit("/", 1)[0], mode="755", name=f"Directory {NODE_EXPORTER}.d")
    paths.put(
        StringIO(node_exporter_drop_in(profile)),
        layout.NODE_EXPORTER_DROP_IN,
        mode="644",
        name=f"node-exporter on {listen_address(profile.listen_host, profile.node_exporter_port)} with our textfile directory",
    )
    packages.installed(["prometheus-node-exporter"], name="prometheus-node-exporter (host metrics)", no_recommends=True)
    units.enabled(NODE_EXPORTER, name=f"Enable {NODE_EXPORTER}")
    started_from_disk(
        name=f"{NODE_EXPORTER} started from the files on disk",
        service=NODE_EXPORTER,
        inputs=[layout.NODE_EXPORTER_DROP_IN],
    )
    host_tool(GPU_METRICS, layout.bin_dir(profile))
    template(
        f"{GPU_METRICS}.service.j2",
        layout.GPU_METRICS_SERVICE,
        name=f"{GPU_METRICS}.service unit",
        tool=layout.tool(profile, GPU_METRICS),
        out=layout.GPU_METRICS_FILE,
        textfile_dir=layout.TEXTFILE_DIR,
    )
    template(
        f"{GPU_METRICS}.timer.j2",
        layout.GPU_METRICS_TIMER,
        name=f"{GPU_METRICS}.timer unit",
        interval=profile.gpu_metrics_interval_s,
    )
    units.enabled(f"{GPU_METRICS}.timer", name=f"Enable {GPU_METRICS}.timer")
    units.started_fresh(
        f"{GPU_METRICS}.timer",
        [layout.GPU_METRICS_TIMER, layout.GPU_METRICS_SERVICE],
        also=[f"{GPU_METRICS}.service"],
        name=f"{GPU_METRICS}.timer running from the files on disk",
    )


def apply(profile: Profile) -> None:
    notifier(profile.notify_command, profile.notify_journal_lines, profile.notify_webhook_env)
    if profile.metrics:
        metrics(profile)
    else:
        skipped(
            "host and GPU metrics",
            "metrics is false in the profile (what an earlier deploy set up stays until uninstall)",
        )
