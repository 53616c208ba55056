"""Control-machine code: the profile and its knobs, locks, caches. Never touches a host."""

import sys

# pyinfra's command line turns off writing byte code for everything a deploy imports, so each run
# compiled this repo's modules again (about 50 ms of a converged run, docs/internals.md). They are
# compiled once into __pycache__ (ignored by git), as for any package, unless the user asked
# Python not to (-B or PYTHONDONTWRITEBYTECODE, which sys.flags keeps).
sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)
