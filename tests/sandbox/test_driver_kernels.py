"""A second kernel on the box: the driver's module step builds for the kernels that have headers
and names the one that has none, instead of failing the run (#35; dkms-project/dkms#484).

Real here: Debian 13's DKMS 3.2.2, the sandbox's installed kernel 6.12.118+deb13-amd64 with its
headers (linux-headers-amd64, installed by the driver role), gcc and kbuild: the module is really
built and installed for it. Simulated: the nvidia module (a stand-in DKMS package named nvidia,
version 590.48.01, that builds a module doing nothing; NVIDIA's DKMS source needs their
repository) and the older kernel (an image file in /boot and its /lib/modules directory without
build/, as a kernel from before an upgrade keeps them). The step runs alone through
tests/sandbox/modules_deploy.py, since deploy.py runs it only on a GPU host.
"""

from __future__ import annotations

import shlex

import pytest

from tests.conftest import SANDBOX_INVENTORY, changed_operations, pyinfra, sandbox_sh
from tests.sandbox.test_unit_hardening import put

pytestmark = pytest.mark.sandbox
sh = sandbox_sh
OLD = "6.12.30+deb13-amd64"  # no headers: from before an upgrade
PACKAGE, VERSION = "glm-flash-standin-nvidia", "590.48.01"
SRC = f"/usr/src/{PACKAGE}-{VERSION}"
MODULE_C = f"""#include <linux/module.h>
MODULE_LICENSE("GPL");
MODULE_VERSION("{VERSION}");
MODULE_DESCRIPTION("glm-flash stand-in for the nvidia module (TEST ONLY): does nothing");
static int __init standin_init(void) {{ return 0; }}
static void __exit standin_exit(void) {{ }}
module_init(standin_init);
module_exit(standin_exit);
"""
DKMS_CONF = f"""PACKAGE_NAME="{PACKAGE}"
PACKAGE_VERSION="{VERSION}"
BUILT_MODULE_NAME[0]="nvidia"
DEST_MODULE_LOCATION[0]="/updates/dkms"
AUTOINSTALL="yes"
"""


def module_for(kernel: str) -> str:
    return sh(f"modinfo -k {shlex.quote(kernel)} -F version nvidia 2>/dev/null", check=False).stdout.strip()


@pytest.fixture
def kernels(sandbox):
    """The sandbox's kernel (with headers) and an older one without; the stand-in DKMS module added."""
    current = sh("ls /boot | sed -n 's/^vmlinuz-//p'").stdout.split()
    assert len(current) == 1, current
    (new,) = current
    assert sh(f"test -d /lib/modules/{new}/build", check=False).returncode == 0, "the sandbox's kernel lacks headers"
    put(f"{SRC}/nvidia.c", MODULE_C)
    put(f"{SRC}/Makefile", "obj-m := nvidia.o\n")
    put(f"{SRC}/dkms.conf", DKMS_CONF)
    sh(f"dkms status -m {PACKAGE} | grep -q . || dkms add {PACKAGE}/{VERSION}")
    sh(f"touch /boot/vmlinuz-{OLD} && mkdir -p /lib/modules/{OLD}")
    try:
        yield new
    finally:
        sh(f"dkms remove {PACKAGE}/{VERSION} --all; rm -rf {SRC} /boot/vmlinuz-{OLD} /lib/modules/{OLD}", check=False)


def test_a_kernel_without_headers_is_skipped_and_named(kernels):
    new = kernels
    assert module_for(new) == "" and module_for(OLD) == ""
    # what the step ran before #35 for every /boot/vmlinuz-*: DKMS fails on the kernel without headers
    before = sh(f"dkms autoinstall -k {OLD}", check=False)
    assert (
        before.returncode != 0
        and f"Your kernel headers for kernel {OLD} cannot be found" in before.stdout + before.stderr
    )
    run = pyinfra("--json", SANDBOX_INVENTORY, "tests/sandbox/modules_deploy.py", timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert f"skipped: nvidia module for kernel {OLD}: its headers are not installed" in out, out[-4000:]
    assert module_for(new) == VERSION  # built and installed for the kernel with headers
    assert module_for(OLD) == ""
    # converged: nothing to build; the old kernel is still named
    again = pyinfra("--json", SANDBOX_INVENTORY, "tests/sandbox/modules_deploy.py", timeout=900)
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert changed_operations(again.stdout) == []
    assert f"skipped: nvidia module for kernel {OLD}" in again.stdout + again.stderr
