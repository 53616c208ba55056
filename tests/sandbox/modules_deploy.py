"""The driver role's module step alone (tests/sandbox/test_driver_kernels.py).

deploy.py runs it only on a host with an NVIDIA GPU (roles/driver.py); the sandbox has none, so
the test runs the same operation by itself, against the sandbox's real kernels, headers and DKMS.
"""

from roles.operations.driver import modules_built

modules_built(name="nvidia module built for every installed kernel")
