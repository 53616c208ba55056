"""Control-machine code: the profile and its knobs, locks, caches. Never touches a host."""
