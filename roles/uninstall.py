"""The way back: remove what deploy.py put on a host (uninstall.py, `make uninstall`).

What is ours comes from where the deploy takes it: control/layout.py (install root, configuration,
root's state, the service user's home, /usr/local/sbin), the roles' own constants (unit files,
the gateway's directory, the CUDA header hook, the NVIDIA repository files) and files/ (every host
tool a link in /usr/local/sbin may name). tests/sandbox/test_uninstall.py compares a deployed
sandbox, after the uninstall, with the bare machine it started from: a file a new role leaves
behind that is not here fails it.

Removed: the units (stopped, disabled, their files and drop-ins), the service and download users
and their groups, the engine environments, CPython, the downloader and the host tools (all under
install_root), /etc/glm-flash (profile, launch spec, API key, staged secrets), root's state
(patch manifests and originals, flag checks), every link in /usr/local/sbin into install_root, the service user's home (caches), logs, the CUDA runfile's download cache.

Kept unless asked: the checkpoint (`uninstall_model`; kept files are handed to root, since their
owner, the download user, goes), and the NVIDIA stack (`uninstall_driver`: driver packages,
NVIDIA's apt source, key and branch pin, the nouveau blacklist, the persistenced drop-in, the
CUDA toolkit). Always kept, and said so: Debian's sources file (the deploy added components
to it) and the Debian packages it installed (other software may use them), the boot target,
the CUDA header fix inside a kept toolkit, the SSH user's sudo rule the README has the operator write
(/etc/sudoers.d/glm-flash: the deploy logs in through it).

Every step reads the host first (roles/facts/leftovers.py): a second uninstall changes nothing.
"""

from __future__ import annotations

import os
import shlex
import sys

from pyinfra import host
from pyinfra.facts.deb import DebPackages
from pyinfra.operations import server

from control import layout
from control.profile import Profile
from roles import cuda_header, headless, model, service, toolkit
from roles.facts.apt import LEGACY_SOURCES
from roles.facts.leftovers import Leftovers
from roles.operations import driver as driver_ops
from roles.operations.checkpoint import download_unit_path
from roles.operations.toolkit import toolkit_package

LOG_DIR = os.path.dirname(cuda_header.HOOK_LOG)
q = shlex.quote
# files/glm-flash-nvidia-repo: where the CUDA runfile is downloaded (5.4 GB), and the installer's log.
RUNFILE_CACHE = layout.CACHE_DIR
RUNFILE_LOG = "/var/log/cuda-installer.log"
# roles/operations/checkpoint.py: the download unit's CacheDirectory= (HF_HOME), made by systemd.
FETCH_CACHE = layout.FETCH_CACHE
DEFAULT_TARGET = "/etc/systemd/system/default.target"  # the link `systemctl set-default` writes
# Where systemd keeps the file of a transient unit (systemd-run's) while the unit is loaded. It keeps
# a stopped one loaded while another unit refers to it (seen in cold CI runs: a job unit `loaded
# inactive dead` beside its failure notifier, still there a minute after its stop). Its file removed
# after the stop, the daemon-reload that follows leaves systemd only its name (`not-found inactive`):
# nothing on disk, and nothing a second uninstall has to change (roles/facts/leftovers.py).
TRANSIENT_DIR = "/run/systemd/transient"


def host_tools() -> list[str]:
    """Every host tool of ours, by the name files/ gives it: a link in /usr/local/sbin may carry it."""
    return sorted(p.name for p in layout.FILES.iterdir() if p.is_file())


def checkpoints(profile: Profile) -> list[str]:
    return [profile.model_path, *([profile.drafter_path] if profile.on_platform.fork_files else [])]


def removed_paths(profile: Profile) -> list[str]:
    """What the uninstall deletes, files and whole directories, always."""
    units = [service.UNIT, service.GPU_UNIT, layout.GATEWAY_UNIT, layout.FRONT_UNIT]
    # a download's unit, there until its checkpoint is complete (roles/operations/checkpoint.py)
    units += [download_unit_path(u) for u in (model.MODEL_UNIT, model.DRAFTER_UNIT)]
    return [
        *units,
        *(f"{u}.d" for u in units),
        layout.CONF_DIR,
        layout.GATEWAY_CONF_DIR,
        profile.install_root,
        layout.ROOT_STATE,
        layout.service_home(profile),
        FETCH_CACHE,
        cuda_header.HOOK,
        layout.EARLYOOM_DROP_IN,  # earlyoom itself (a Debian package) stays, on its own defaults
        # roles/watch.py: the notifier (unit, tool, settings, webhook, its record), the GPU collector's
        # units and our textfile directory, node-exporter's drop-in (the package stays, stopped below)
        layout.NOTIFY_UNIT,
        layout.NOTIFY_TOOL_DIR,
        layout.NOTIFY_CONF_DIR,
        layout.NOTIFY_STATE,
        layout.GPU_METRICS_SERVICE,
        layout.GPU_METRICS_TIMER,
        layout.TEXTFILE_DIR,
        layout.NODE_EXPORTER_DROP_IN,
        LOG_DIR,
        RUNFILE_CACHE,
        *(f"{layout.SBIN}/{tool}" for tool in host_tools()),
    ]


def nvidia_paths(profile: Profile) -> list[str]:
    """The NVIDIA stack's files the deploy wrote: removed with `uninstall_driver`, kept otherwise."""
    return [
        driver_ops.SOURCES_FILE,
        driver_ops.KEYRING,
        driver_ops.PIN_FILE,
        driver_ops.BLACKLIST_FILE,
        driver_ops.PERSISTENCED_DROPIN,
        toolkit.toolkit_path(profile),
        RUNFILE_LOG,
    ]


def accounts(profile: Profile) -> list[str]:
    return [profile.service_user, model.fetch_user(profile)]


KEPT_ALWAYS = (
    "/etc/apt/sources.list.d/debian.sources (Debian's own sources; the deploy added contrib, non-free)",
    "Debian packages the deploy installed (base_packages: other software may use them)",
    "the display managers the deploy disabled",
    "prometheus-node-exporter (a Debian package), stopped and disabled: without our drop-in it would "
    "listen on every interface",
)
# Kept and named when present: what the deploy changed of the system's own.
# The file name the README tells the operator to write (sandbox/sandbox.py writes the same).
SUDOERS_RULE = "/etc/sudoers.d/glm-flash"

KEPT_IF_PRESENT = {
    f"{LEGACY_SOURCES}.glm-flash-orig": "the old apt sources the deploy moved aside",
    DEFAULT_TARGET: f"the boot target the deploy set ({headless.TARGET})",
    # prometheus-node-exporter's own (its maintainer script made it), kept with the package
    "/var/lib/prometheus": "prometheus-node-exporter's state directory (the package stays, stopped)",
    # A gateway's: the nginx package stays, and without the mask its own unit would serve Debian's
    # default site on port 80 at the next boot.
    layout.NGINX_MASK: "the mask on Debian's nginx.service (the nginx package stays; `systemctl unmask nginx` to use it)",
    # The README's one-time step, by hand: the SSH user's sudo without a password. The deploy logs in
    # through it; removing it would lock the next deploy (and this uninstall's own login) out of root.
    SUDOERS_RULE: "the SSH user's passwordless sudo, written by hand as in the README; the deploy logs in through it",
}


def apply(profile: Profile) -> None:
    p = profile
    remove = removed_paths(p)
    nvidia = nvidia_paths(p)
    models = checkpoints(p)
    found = host.get_fact(
        Leftovers,
        paths=tuple(remove + nvidia + models + list(KEPT_IF_PRESENT)),
        users=tuple(accounts(p)),
        groups=tuple(accounts(p)),
        owned=tuple(models),
        link_dir=layout.SBIN,
        link_target=p.install_root,
    )
    kept = [f"{path} ({why})" for path, why in KEPT_IF_PRESENT.items() if path in found.paths]

    # A template (glm-flash-notify@.service) is no unit to stop: named, it would fail the whole command.
    units = sorted(u for u in found.units if "@." not in u)
    if units:
        server.shell(
            name=f"Stop and disable {', '.join(units)}",
            # Transient units (systemd-run's: jobs, flag checks, transfers) have no file to disable:
            # stopped here, their files under TRANSIENT_DIR removed below with the rest.
            commands=[
                "systemctl stop " + " ".join(q(u) for u in units) + " || true",
                "systemctl disable " + " ".join(q(u) for u in units) + " 2>/dev/null || true",
                "systemctl reset-failed " + " ".join(q(u) for u in units) + " 2>/dev/null || true",
            ],
        )

    gone = [path for path in remove if path in found.paths]
    gone += [f"{TRANSIENT_DIR}/{u}" for u in sorted(found.transient) if "/" not in u]  # after their stop above
    gone += sorted(found.links - set(gone))
    if p.uninstall_model:
        gone += [m for m in models if m in found.paths]
    else:
        kept += [f"{m} (the checkpoint; uninstall_model: true removes it)" for m in models if m in found.paths]
        owned = sorted(found.not_root_owned)
        if owned:
            # Its owner, the download user, is removed below: root keeps the files, nobody else writes them.
            server.shell(
                name=f"Kept checkpoint handed to root: {', '.join(owned)}",
                commands=[f"chown -R root:root {q(d)}" for d in owned],
            )

    installed = host.get_fact(DebPackages) or {}
    if p.uninstall_driver:
        packages = sorted(
            name
            for name in installed
            if driver_ops.DRIVER_PACKAGE_RE.match(name) or name.startswith(toolkit_package(p.cuda_version))
        )
        if packages:
            server.shell(
                name=f"NVIDIA driver and toolkit packages purged ({len(packages)})",
                commands=["DEBIAN_FRONTEND=noninteractive apt-get purge -y " + " ".join(packages)],
            )
        gone += [path for path in nvidia if path in found.paths]
    else:
        kept += [f"{path} (NVIDIA stack; uninstall_driver: true removes it)" for path in nvidia if path in found.paths]
        if any(driver_ops.DRIVER_PACKAGE_RE.match(name) for name in installed):
            kept.append("the NVIDIA driver packages (uninstall_driver: true purges them)")

    if gone:
        shown = ", ".join(gone[:4]) + (f" and {len(gone) - 4} more" if len(gone) > 4 else "")
        server.shell(name=f"Removed {shown}", commands=["rm -rf -- " + " ".join(q(g) for g in gone)])
    if units or any(path.startswith("/etc/systemd/") for path in gone):
        server.shell(name="systemd reloaded", commands=["systemctl daemon-reload"])
    if layout.NODE_EXPORTER_DROP_IN in gone:
        server.shell(
            name="prometheus-node-exporter stopped and disabled (the package stays)",
            commands=[
                "systemctl disable --now prometheus-node-exporter.service 2>/dev/null || true",
                # the drop-in's directory, ours, unless someone else's drop-in sits there too
                f"rmdir --ignore-fail-on-non-empty {q(os.path.dirname(layout.NODE_EXPORTER_DROP_IN))} 2>/dev/null || true",
            ],
        )
    if p.uninstall_driver and driver_ops.SOURCES_FILE in gone:
        server.shell(name="apt lists refreshed without NVIDIA's repository", commands=["apt-get update -qq"])
    if p.uninstall_driver and driver_ops.BLACKLIST_FILE in gone:
        server.shell(name="initramfs rebuilt without the nouveau blacklist", commands=["update-initramfs -u"])

    for user in accounts(p):
        if user in found.users:
            server.shell(name=f"User {user} removed", commands=[f"userdel {q(user)}"])
    for group in accounts(p):
        if group in found.groups:
            # userdel removes a user's own group; a group left alone (no user) goes here.
            server.shell(
                name=f"Group {group} removed",
                commands=[f"! getent group {q(group)} >/dev/null || groupdel {q(group)}"],
            )

    print(
        f"glm-flash uninstall [{host.name}]: kept\n" + "".join(f"  - {k}\n" for k in [*kept, *KEPT_ALWAYS]),
        file=sys.stderr,
        end="",
    )
