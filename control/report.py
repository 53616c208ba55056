"""Say plainly what a run did not do on this host, and why; kept for the end-of-deploy summary."""

from collections import defaultdict

from pyinfra import host, logger

# host name -> [(step, reason)], in the order they were reported (roles/summary.py prints them).
SKIPPED: dict[str, list[tuple[str, str]]] = defaultdict(list)
# host name -> [reason]: why the host was refused (pyinfra_ext/refusal.py).
REFUSED: dict[str, list[str]] = defaultdict(list)


def skipped(step: str, reason: str) -> None:
    logger.warning(f"[{host.name}] skipped: {step}: {reason}")
    if (step, reason) not in SKIPPED[host.name]:
        SKIPPED[host.name].append((step, reason))
