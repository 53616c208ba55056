"""Take a Debian 13 box to a tested, serving GLM-5.3-Flash node.

    pyinfra inventory/l40s.py deploy.py

Roles run in this order; each reads facts and changes only what differs.
"""

from control import layout, profile
from pyinfra_ext import host_failures, op_order, refusal
from roles import (
    base,
    cuda_header,
    driver,
    hardware,
    headless,
    memory_guard,
    model,
    preflight,
    service,
    status,
    summary,
    toolkit,
    tools,
    users,
    watch,
)
from roles.engines import dispatch

op_order.install()  # pyinfra's operation order without reading source text (pyinfra_ext/op_order.py)
host_failures.install()  # a host that goes away mid-run fails alone; the others go on
p = profile.for_current_host()  # inventory mistakes end the whole run, before anything is changed
with refusal.host_refusals():  # a refusal decided from this host's facts fails this host only
    preflight.apply(p)  # disk, cores, CPU features, memory: refuses this host before any change
    hardware.apply(p)  # the GPUs are the ones the profile was written for

    base.apply(p)  # apt sources, base packages
    tools.apply(p)  # our host commands
    watch.apply(p)  # word when a unit fails; host, GPU metrics (before the long jobs, whose failures it reports)
    model.apply(p)  # the checkpoint's download starts in the background; waited for before the engine's switch
    driver.apply(p, layout.bin_dir(p))  # NVIDIA repo (key, branch checked), pinned branch, DKMS; reboots when needed
    toolkit.apply(p, layout.bin_dir(p))  # CUDA cuda_version under /usr/local/cuda-X.Y (repository or runfile)
    cuda_header.apply(p)  # glibc 2.41 fix of CUDA 12.x headers, re-checked every deploy
    users.apply(p)  # the unprivileged service user
    headless.apply(p)  # no desktop holding GPU memory
    memory_guard.apply(p)  # unified memory (GB10): earlyoom stops the engine before the box runs out
    # the platform's engine: built beside, patched, checked, switched; the checkpoint waited for before the check
    engine = dispatch.for_profile(p).apply(p, checkpoint_ready=lambda: model.ready(p))
    service.apply(p, engine)  # runs exactly the launch spec the engine's parser accepted
    status.apply(p)  # the profile values `glm-flash status` compares the host with
summary.apply(p)  # per host at the end: endpoint, serving, engine, model, driver, skipped (stderr)
