"""The sandbox's users are a stock Debian 13 box's (issue 39), and the deploy reaches it as one.

Debian 13's installer, when root gets no password, leaves root without one ('*': no password
login) and gives the first user sudo; sshd keeps its default PermitRootLogin prohibit-password
(sshd -T says without-password). The deploy logs in as that user, `glm`, with pyinfra's `_sudo`
(inventory/sandbox.py), after the README's one-time passwordless-sudo step. Root's key login
stays for the tests' own ssh, as Debian's default allows it."""

from __future__ import annotations

import pytest

from tests.conftest import SANDBOX_INVENTORY, inventory_hosts, sandbox_sh

pytestmark = pytest.mark.sandbox


def test_the_box_is_a_stock_debian_13s_and_the_deploy_comes_in_as_its_sudo_user(sandbox):
    assert "permitrootlogin without-password" in sandbox_sh("sshd -T").stdout.splitlines()
    assert sandbox_sh("getent shadow root | cut -d: -f2").stdout.strip() in ("*", "!", "!*")
    assert sandbox_sh("id -nG glm").stdout.split() == ["glm", "sudo"]
    assert sandbox_sh("getent shadow glm | cut -d: -f2").stdout.startswith("$6$")  # a password, as installed
    assert sandbox_sh("stat -c '%a %U' /etc/sudoers.d/glm-flash && visudo -cq").stdout.strip() == "440 root"
    ((_, data),) = inventory_hosts(SANDBOX_INVENTORY)
    assert (data["ssh_user"], data["_sudo"]) == ("glm", True)
    # what the deploy wrote is root's, through sudo
    assert sandbox_sh("stat -c '%U %a' /etc/glm-flash/launch.json").stdout.split()[0] == "root"
    # sudo logged the deploy's commands as glm's
    log = sandbox_sh("journalctl -t sudo --no-pager -n 200 -o cat").stdout
    assert "glm : " in log and "USER=root" in log
