"""Take a Debian 13 box to a tested, serving GLM-5.3-Flash node.

    pyinfra inventory/l40s.py deploy.py

Roles run in this order; each reads facts and changes only what differs.
"""

from roles import base, hardware, headless, profile, service, tools, users
from roles import cuda_header
from roles import driver, toolkit

p = profile.for_current_host()
hardware.apply(p)

base.apply(p)
tools.apply(p)
driver.apply(p)           # NVIDIA repo, pinned branch, DKMS, holds; reboots only when needed
toolkit.apply(p)          # CUDA cuda_version under /usr/local/cuda-X.Y, selected by path
cuda_header.apply(p)      # after tools: uses glm-flash-patch; re-checked every deploy
users.apply(p)
headless.apply(p, tools.bin_dir(p))
service.apply(p)
