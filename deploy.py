"""Take a Debian 13 box to a tested, serving GLM-5.3-Flash node.

    pyinfra inventory/l40s.py deploy.py

Roles run in this order; each reads facts and changes only what differs.
"""

from control import layout, profile
from roles import (
    base,
    cuda_header,
    driver,
    engine_kt,
    engine_vllm,
    hardware,
    headless,
    model,
    preflight,
    python,
    service,
    status,
    summary,
    toolkit,
    tools,
    users,
)

p = profile.for_current_host()
preflight.apply(p)  # disk, cores, CPU features, memory: refuses this host before any change
hardware.apply(p)  # the GPUs are the ones the profile was written for

base.apply(p)  # apt sources, base packages
tools.apply(p)  # our host commands
driver.apply(
    p, layout.bin_dir(p)
)  # NVIDIA repo (key and branch checked), pinned branch, DKMS, holds; reboots only when needed
toolkit.apply(p, layout.bin_dir(p))  # CUDA cuda_version under /usr/local/cuda-X.Y (repository or runfile)
cuda_header.apply(p)  # glibc 2.41 fix of CUDA 12.x headers, re-checked every deploy
users.apply(p)  # the unprivileged service user
headless.apply(p, layout.bin_dir(p))
model.apply(p)  # the checkpoint, before the engine patches its config.json
engine = engine_kt.apply(p, python.apply(p)) or engine_vllm.apply(p)  # built beside, patched, switched
service.apply(p, engine_switch=engine.switch_op if engine else None)
status.apply(p)  # the profile values `glm-flash status` compares the host with
summary.apply(p)  # per host at the end: endpoint, serving, engine, model, driver, skipped (stderr)
