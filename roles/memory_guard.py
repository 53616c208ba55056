"""The memory guard of a unified-memory box (GB10): earlyoom stops the engine when the host's
available memory runs low, before the box stalls.

On the GB10 the GPU's allocations come out of the memory /proc/meminfo reports, but out of no
cgroup's account: a unit's MemoryMax= (or a container's limit) never sees them, and the kernel's
OOM killer acts only once the box is already thrashing. The GB10 fork guards against that with a
script of its own that kills the server from /proc/meminfo readings (docs/sources.md §20). This
role does the same with a maintained tool, earlyoom (Ubuntu's and Debian's package), which reads
MemAvailable from /proc/meminfo up to ten times a second:

- earlyoom installed, its unit enabled and running;
- a drop-in of ours replaces its command line (the package's own defaults file is left alone):
  SIGTERM once MemAvailable is below `memory_guard_gib`, SIGKILL below half of it, swap ignored
  (earlyoom acts when memory and swap are both low; `-s 100,100` makes the swap side always
  true), never sshd, journald or earlyoom itself (`--avoid`);
  restarted when the drop-in changed (decided from the host's state);
- glm-flash.service carries OOMScoreAdjust=1000 (templates/glm-flash.service.j2): the engine's
  processes have the highest oom_score, so they are earlyoom's choice, and the kernel's.

Failure mode: earlyoom stops the engine (logged in earlyoom's journal as "sending SIGTERM to process
..."); systemd restarts it (Restart=on-failure, capped by restart_limit). `memory_guard_gib` 0: no
guard (the L40S box's default: its GPU memory is its own).
"""

from __future__ import annotations

from io import StringIO

from pyinfra.operations import systemd

from control import layout
from control.profile import Profile
from control.report import skipped
from roles.operations import packages, paths
from roles.operations.service_restart import started_from_disk

UNIT = "earlyoom.service"
DROP_IN = layout.EARLYOOM_DROP_IN
EARLYOOM = "/usr/bin/earlyoom"  # the Debian/Ubuntu package's binary
# never chosen: the way in, the logs, the guard itself (earlyoom's --avoid regex on process names)
AVOID = "^(sshd|systemd|systemd-journal|earlyoom)$"


def command(profile: Profile) -> list[str]:
    """earlyoom's arguments: sizes in KiB (earlyoom -M SIZE[,KILL_SIZE])."""
    term = int(profile.memory_guard_gib * 1024 * 1024)
    return [EARLYOOM, "-M", f"{term},{term // 2}", "-s", "100,100", "-r", "3600", "--avoid", AVOID]


def drop_in(profile: Profile) -> str:
    # systemd's command line: "$$" is a literal "$"; single quotes keep the regex one argument
    argv = " ".join(f"'{a}'" if "|" in a else a for a in command(profile)).replace("$", "$$")
    return (
        "# glm-flash: the memory guard of a unified-memory box (roles/memory_guard.py). Owned by the deploy.\n"
        "[Service]\n"
        "ExecStart=\n"
        f"ExecStart={argv}\n"
    )


def apply(profile: Profile) -> None:
    if not profile.memory_guard_gib:
        skipped("memory guard", "memory_guard_gib is 0 in the profile")
        return
    packages.installed(["earlyoom"], name="earlyoom (memory guard)", update=True)
    paths.directory(DROP_IN.rsplit("/", 1)[0], mode="755", name=f"Directory {UNIT}.d")
    paths.put(
        StringIO(drop_in(profile)),
        DROP_IN,
        mode="644",
        name=f"earlyoom acts below {profile.memory_guard_gib:g} GiB of available memory",
    )
    systemd.service(name=f"Enable {UNIT}", service=UNIT, enabled=True)
    started_from_disk(name=f"{UNIT} started from the files on disk", service=UNIT, inputs=[DROP_IN])
