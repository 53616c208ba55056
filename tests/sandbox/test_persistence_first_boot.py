"""The first deploy on a box whose cards nouveau still holds: nvidia-persistenced is enabled, not
started, and the run goes on to announce the reboot instead of stopping; after the (simulated)
reboot it starts and the run converges (#35).

Simulated, shaped from the public record: the driver's daemon (a stand-in /usr/bin/nvidia-persistenced
that exits as the real one does when it cannot query the devices, NVIDIA/ansible-role-nvidia-driver#3,
and runs once the driver is loaded) and its unit as NVIDIA's package ships it; the nvidia module on
disk for the running kernel (tests/sandbox/test_driver_kernels.py's stand-in DKMS module, built by
the real DKMS for the sandbox's kernel and installed for the running one); the reboot: the loaded
driver's /proc/driver/nvidia/version appears (a bind mount over the empty /proc/driver). Real: the
operations, systemd 257, modinfo.
"""

from __future__ import annotations

import pytest

from tests.conftest import SANDBOX_INVENTORY, changed_operations, pyinfra, sandbox_sh
from tests.sandbox.test_driver_kernels import DKMS_CONF, MODULE_C, PACKAGE, SRC, VERSION
from tests.sandbox.test_unit_hardening import put

pytestmark = pytest.mark.sandbox
sh = sandbox_sh
DAEMON = "/usr/bin/nvidia-persistenced"
UNIT_FILE = "/etc/systemd/system/nvidia-persistenced.service"
FAKE_DRIVER = "/run/glm-flash-test-driver"
STANDIN = """#!/bin/sh
# stand-in nvidia-persistenced (TEST ONLY): fails as the real one does while no NVIDIA driver is loaded
if [ ! -e /proc/driver/nvidia/version ]; then
    echo "nvidia-persistenced failed to initialize. Check syslog for more details." >&2
    echo "Failed to query NVIDIA devices. Please ensure that the NVIDIA device files exist." >&2
    exit 1
fi
sleep infinity >/dev/null 2>&1 &  # a daemon: forks, then the parent exits (Type=forking)
exit 0
"""
UNIT = """[Unit]
Description=NVIDIA Persistence Daemon (stand-in, TEST ONLY)
Wants=syslog.target

[Service]
Type=forking
ExecStart=/usr/bin/nvidia-persistenced --user nvidia-persistenced

[Install]
WantedBy=multi-user.target
"""


def run() -> tuple[str, list[str]]:
    r = pyinfra("--json", SANDBOX_INVENTORY, "tests/sandbox/persistence_deploy.py", timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return r.stdout + r.stderr, changed_operations(r.stdout)


def state() -> str:
    return sh("systemctl is-enabled nvidia-persistenced; systemctl is-active nvidia-persistenced", check=False).stdout


@pytest.fixture
def driver_on_disk(sandbox):
    put(DAEMON, STANDIN)
    put(UNIT_FILE, UNIT)
    sh(f"chmod 0755 {DAEMON} && systemctl daemon-reload")
    put(f"{SRC}/nvidia.c", MODULE_C)
    put(f"{SRC}/Makefile", "obj-m := nvidia.o\n")
    put(f"{SRC}/dkms.conf", DKMS_CONF)
    new = sh("ls /boot | sed -n 's/^vmlinuz-//p'").stdout.split()[0]
    sh(
        f"dkms status -m {PACKAGE} | grep -q . || dkms add {PACKAGE}/{VERSION}; dkms autoinstall -k {new} >/dev/null"
        f" && r=$(uname -r) && mkdir -p /lib/modules/$r/updates/dkms"
        f" && cp /lib/modules/{new}/updates/dkms/nvidia.ko* /lib/modules/$r/updates/dkms/ && depmod $r"
    )
    assert sh("modinfo -F version nvidia").stdout.strip() == VERSION
    try:
        yield
    finally:
        sh(
            f"umount {'/proc/driver'} 2>/dev/null; systemctl disable --now nvidia-persistenced; "
            f"rm -rf {DAEMON} {UNIT_FILE} /etc/systemd/system/nvidia-persistenced.service.d {FAKE_DRIVER}; "
            f"systemctl daemon-reload; systemctl reset-failed nvidia-persistenced; "
            f"rm -rf /lib/modules/$(uname -r); dkms remove {PACKAGE}/{VERSION} --all; rm -rf {SRC}",
            check=False,
        )


def test_first_deploy_announces_the_reboot_then_converges_after_it(driver_on_disk):
    # the daemon cannot start while no driver is loaded (nouveau holds the cards)
    assert sh("systemctl start nvidia-persistenced", check=False).returncode != 0
    sh("systemctl reset-failed nvidia-persistenced")
    out, _ = run()
    assert (
        f"nvidia-persistenced enabled, not started until the reboot: driver {VERSION} is installed but not loaded"
        in out
    )
    assert f"reboot pending (allow_reboot is false, not rebooting): driver {VERSION} is installed but not loaded" in out
    assert state().split() == ["enabled", "inactive"]
    # the reboot, simulated: the driver on disk is the one loaded
    sh(
        f"mkdir -p {FAKE_DRIVER}/nvidia && echo 'NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {VERSION}"
        f"  Release Build  (root@standin)' > {FAKE_DRIVER}/nvidia/version && mount --bind {FAKE_DRIVER} /proc/driver"
    )
    out, _ = run()
    assert state().split() == ["enabled", "active"], out[-3000:]
    assert "reboot pending" not in out
    out, changed = run()
    assert changed == [], out[-3000:]
