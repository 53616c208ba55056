"""Take a Debian 13 box to a tested, serving GLM-5.3-Flash node.

    pyinfra inventory/l40s.py deploy.py

Roles run in this order; each reads facts and changes only what differs.
"""

from roles import base, hardware, headless, profile, service, tools, users
from roles import cuda_header
from roles import driver, toolkit
from roles import engine_vllm
from roles import engine_kt, python

p = profile.for_current_host()
hardware.apply(p)

base.apply(p)
tools.apply(p)
driver.apply(p)           # NVIDIA repo, pinned branch, DKMS, holds; reboots only when needed
toolkit.apply(p)          # CUDA cuda_version under /usr/local/cuda-X.Y, selected by path
cuda_header.apply(p)      # after tools: uses glm-flash-patch; re-checked every deploy
users.apply(p)
headless.apply(p, tools.bin_dir(p))
kt_python = python.apply(p)          # L40S: the engine's CPython 3.11, uploaded from python_source; None elsewhere
kt_engine = engine_kt.apply(p, kt_python)  # L40S: locked env built beside the old one, patched, then switched
gb10_engine = engine_vllm.apply(p)   # GB10: vLLM-Moet fork at vllm_ref, patches, drafter; None elsewhere
service.apply(p)
if kt_engine and kt_engine.switch_op is not None and p.require_gpu:
    from pyinfra.operations import systemd
    systemd.service(name="Restart glm-flash.service on the new engine environment", service="glm-flash.service",
                    running=True, restarted=True, _if=kt_engine.switch_op.did_change)
if gb10_engine and gb10_engine.switch_op is not None:
    from pyinfra.operations import systemd
    systemd.service(name="Restart glm-flash.service on the new engine environment", service="glm-flash.service",
                    running=True, restarted=True, _if=gb10_engine.switch_op.did_change)
