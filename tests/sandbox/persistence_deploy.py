"""The driver role's last two steps alone (tests/sandbox/test_persistence_first_boot.py).

deploy.py runs them only on a host with an NVIDIA GPU (roles/driver.py); the sandbox has none, so
the test runs the same operations by itself, allow_reboot false: a reboot is announced, not done.
"""

from roles.operations.driver import persistence_mode, rebooted_if_needed

persistence_mode(name="Persistence mode (nvidia-persistenced --persistence-mode)")
rebooted_if_needed(name="Reboot if a new driver or kernel is not running", allow_reboot=False)
