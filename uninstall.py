"""Remove what deploy.py put on a host; keep the checkpoint and the NVIDIA stack unless asked.

    pyinfra inventory/l40s.py uninstall.py                                # or: make uninstall INVENTORY=...
    pyinfra inventory/l40s.py uninstall.py --data uninstall_model=true   # the checkpoint too
    pyinfra inventory/l40s.py uninstall.py --data uninstall_driver=true  # driver, repo, toolkit too

What goes and what stays: roles/uninstall.py. A second run changes nothing; deploy.py afterwards
converges the host again.
"""

from control import profile
from roles import uninstall

p = profile.for_current_host()  # inventory mistakes end the whole run, before anything is changed
uninstall.apply(p)  # units, users, environments, host tools, state, credentials; says what it kept
