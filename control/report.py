"""Say plainly what a run did not do on this host, and why; kept for the end-of-deploy summary."""

from collections import defaultdict

from pyinfra import host, logger

# host name -> [(step, reason)], in the order they were reported (roles/summary.py prints them).
SKIPPED: dict[str, list[tuple[str, str]]] = defaultdict(list)
# host name -> [reason]: why the host was refused (pyinfra_ext/refusal.py).
REFUSED: dict[str, list[str]] = defaultdict(list)
# worker -> the seed it receives files from in this run (roles/fleet/; roles/summary.py names it).
SEEDED_BY: dict[str, str] = {}


def skipped(step: str, reason: str) -> None:
    logger.warning(f"[{host.name}] skipped: {step}: {reason}")
    if (step, reason) not in SKIPPED[host.name]:
        SKIPPED[host.name].append((step, reason))
