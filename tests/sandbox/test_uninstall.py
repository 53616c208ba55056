"""The way back, on the deployed sandbox (docs/uninstall.md): uninstall.py leaves nothing of ours
but what it says it kept, a second run changes nothing, and a deploy afterwards converges again
(then changes nothing), so the sandbox is deployed again for the tests after this one.

"Nothing of ours" is measured, not listed: the sandbox after the uninstall is compared with the
bare Debian 13 image it was unpacked from (sandbox/sandbox.py image()) under /etc, /usr/local, /opt,
/srv, /var/lib, /var/log and /var/cache, less what dpkg owns (the Debian packages the deploy installed, kept
on purpose), less what Debian itself writes as it runs (apt, dpkg and systemd state, logs, the
machine's keys: RUNTIME). Whatever is left must lie under a path the uninstall named as kept.
Users and unit files are compared the same way.

Simulated, to keep CI within its time: the engine environment is not rebuilt after the uninstall.
The fixture moves `/opt/glm-flash/engine/envs` and its wheelhouse to /root (outside every scanned
root) before uninstalling, and the redeploy test moves them back first, so that deploy re-creates
everything else (users, units, tools, state, keys, the switch to the environment) but not the 11 GB
environment the first deploy of the session already built and checked from the same lock (building
it again is 10 minutes of pip on the CI machine). So the uninstall here removes the rest of
/opt/glm-flash/engine, not those two directories; on a real host it removes them with the rest
(the same `rm` of the install root). The move is a rename: on the sandbox's overlay of its snapshot
(mounted with redirect_dir=on) nothing under them is copied. It was a hard-linked copy, which on
the overlay copied all 16 GB into the upper layer (the run's lowest free disk, 15-17 GB of 71).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile

import pytest

from tests.conftest import REPO, SANDBOX_INVENTORY, changed_operations, pyinfra, sandbox_sh

ROOTS = ("etc", "usr/local", "opt", "srv", "var/lib", "var/log", "var/cache")
# What Debian writes as it runs, deployed or not: package manager state and caches, systemd's own
# state, logs, the machine's identity and keys made at first boot, and the files that name users
# (compared below by user instead).
RUNTIME = re.compile(
    r"^/(var/lib/(apt|dpkg|systemd|ucf|dhcp|private|python|pam|sgml-base|xml-core|polkit-1|dbus|initramfs-tools"
    r"|usrmerge|man-db|shells\.state|dkms)"
    r"|var/log/(?!glm)|var/cache/(?!glm)|etc/(ssh/ssh_host_|machine-id|ld\.so\.cache|\.pwd\.lock|(passwd|group|shadow|gshadow|subuid|subgid)-?$"
    r"|systemd/system/.*\.wants/|alternatives/|ca-certificates|ssl/certs/|apt/trusted\.gpg\.d/|apt/apt\.conf\.d/00"
    r"|apt/sources\.list\.d/debian\.sources|resolv\.conf|hostname|hosts|adjtime|udev/hwdb\.bin|localtime|timezone)"
    r"|etc/(initramfs-tools|kernel|modules-load\.d|dkms)/)"
)


# Written by the maintainer scripts of the Debian packages the deploy installed (kept on purpose,
# docs/uninstall.md), so dpkg's file lists do not name them.
PACKAGE_SCRIPTS = re.compile(
    r"^/(etc/(\.updated|inputrc|modules|networks|python3(/.*)?|systemd/user/sockets\.target\.wants(/.*)?"
    r"|rc[0-6S]\.d/[KS][0-9]{2}prometheus-node-exporter)"
    r"|usr/local/lib/python3\.\d+(/dist-packages)?)$"
)
# The sandbox's own parts (sandbox/sandbox.py, sandbox/nvidia_standin.py), not the deploy's.
SANDBOX = re.compile(r"^/(srv/glm-flash-standin|etc/ssh/sshd_config\.d/sandbox\.conf)(/|$)")


def bare_image_paths() -> set[str]:
    code = "import runpy; print(runpy.run_path('sandbox/sandbox.py')['image']())"
    image = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    with tarfile.open(image.stdout.strip()) as tar:
        return {"/" + m.name.lstrip("./").rstrip("/") for m in tar.getmembers()}


def host_paths() -> set[str]:
    roots = " ".join(f"/{r}" for r in ROOTS)
    out = sandbox_sh(f"find {roots} -xdev 2>/dev/null; true").stdout
    return {line for line in out.splitlines() if line}


def dpkg_paths() -> set[str]:
    return set(sandbox_sh("cat /var/lib/dpkg/info/*.list").stdout.splitlines())


def kept_paths(output: str) -> list[str]:
    """The paths the uninstall's own summary names as kept ('  - /path (why)')."""
    return re.findall(r"^  - (/\S+)", output, flags=re.M)


def uninstall(*data: str) -> subprocess.CompletedProcess:
    args = [a for d in data for a in ("--data", d)]
    return pyinfra("--json", SANDBOX_INVENTORY, "uninstall.py", *args, timeout=1200)


ENGINE = "/opt/glm-flash/engine"
SNAPSHOT = "/root/glm-flash-engine-snapshot"  # /root: outside every root host_paths() scans
FLAG_CHECK = "glm-flash-flag-check-1.service"
JOB = "glm-flash-job-linger.service"  # a job name no deploy uses: the deploy's own may be held too
HOLDER = "sandbox-holds-the-job.service"  # not ours: the uninstall leaves it alone


@pytest.fixture(scope="module")
def uninstalled(sandbox):
    # The environments and the wheelhouse, moved aside (a rename: nothing under them copied).
    sandbox_sh(f"rm -rf {SNAPSHOT} && mkdir -p {SNAPSHOT} && mv {ENGINE}/envs {ENGINE}/wheelhouse {SNAPSHOT}/")
    # Transient units of ours (systemd-run's), as cold CI runs left them: a flag check running
    # (files/glm-flash-check-flags), and a job that ended but that systemd keeps `loaded inactive dead`
    # beside its failure notifier because another unit refers to it (here a unit not of ours,
    # After= it, started first: systemd keeps the job loaded, its file under /run/systemd/transient).
    sandbox_sh(
        f"systemd-run --quiet --service-type=exec --unit={FLAG_CHECK} sleep 3600 && "
        f"systemd-run --quiet --unit={HOLDER} --property=After={JOB} sleep 3600 && "
        f"systemd-run --quiet --wait --collect --service-type=exec --unit={JOB} "
        f"--property=OnFailure=glm-flash-notify@{JOB}.service true && "
        f"systemctl list-units --all --plain --no-legend {JOB} | grep -q 'loaded *inactive'"
    )
    first = uninstall()
    sandbox_sh(f"systemctl stop {HOLDER}")
    assert first.returncode == 0, first.stderr[-6000:]
    state = {
        "first": first,
        "paths": host_paths(),
        "dpkg": dpkg_paths(),
        "passwd": sandbox_sh("getent passwd | cut -d: -f1").stdout.split(),
        "group": sandbox_sh("getent group | cut -d: -f1").stdout.split(),
        # (through cat: systemctl exits 1 when no file matches, the state wanted here)
        "units": sandbox_sh("systemctl list-unit-files --plain --no-legend 'glm-flash*' | cat").stdout.splitlines(),
        # what systemd still holds by name (a unit whose file is gone), shown when the second run changes
        "loaded": sandbox_sh("systemctl list-units --all --plain --no-legend 'glm-flash*'").stdout,
    }
    second = uninstall()
    assert second.returncode == 0, second.stderr[-6000:]
    state["second"] = second
    return state


def test_nothing_of_ours_is_left_but_what_it_says_it_kept(uninstalled):
    out = uninstalled["first"].stderr
    kept = kept_paths(out)
    assert "/srv/models/GLM-5.3-Flash" in kept, out[-3000:]  # the checkpoint, by default
    bare = bare_image_paths()
    left = sorted(
        p
        for p in uninstalled["paths"] - bare - uninstalled["dpkg"]
        if not (RUNTIME.match(p) or PACKAGE_SCRIPTS.match(p) or SANDBOX.match(p))
        and not any(p == k or p.startswith(k + "/") for k in kept)
        # a directory that only holds a kept path (/srv/models for /srv/models/GLM-5.3-Flash)
        and not any(k.startswith(p + "/") for k in kept)
    )
    assert left == [], "left on the host, neither removed nor named as kept:\n" + "\n".join(left[:80])


def test_users_groups_and_units_are_gone(uninstalled):
    assert not [u for u in uninstalled["passwd"] if u.startswith("glm-flash")]
    assert not [g for g in uninstalled["group"] if g.startswith("glm-flash")]
    assert uninstalled["units"] == [], f"loaded units after the first run:\n{uninstalled['loaded']}"
    # both were found and stopped (list-unit-files above lists a transient unit while systemd holds it)
    changed = changed_operations(uninstalled["first"].stdout)
    assert any(FLAG_CHECK in op and JOB in op for op in changed), changed


def test_the_kept_checkpoint_belongs_to_root(uninstalled):
    assert sandbox_sh("find /srv/models/GLM-5.3-Flash ! -user root | head -1").stdout.strip() == ""
    assert sandbox_sh("test -s /srv/models/GLM-5.3-Flash/config.json", check=False).returncode == 0


def test_a_second_uninstall_changes_nothing(uninstalled):
    changed = changed_operations(uninstalled["second"].stdout)
    assert changed == [], f"{changed}; loaded units after the first run:\n{uninstalled['loaded']}"


def test_a_deploy_after_it_converges_and_then_changes_nothing(uninstalled):
    """Last in the file: leaves the sandbox deployed for the tests after this one. The engine's
    environments come back from the fixture's snapshot first (see the module docstring)."""
    sandbox_sh(f"mkdir -p {ENGINE} && mv {SNAPSHOT}/envs {SNAPSHOT}/wheelhouse {ENGINE}/ && rm -rf {SNAPSHOT}")
    redeploy = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")
    assert redeploy.returncode == 0, redeploy.stderr[-6000:]
    again = pyinfra("--json", SANDBOX_INVENTORY, "deploy.py")
    assert again.returncode == 0, again.stderr[-6000:]
    assert changed_operations(again.stdout) == []
