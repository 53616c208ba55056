"""Say plainly what a run did not do on this host, and why."""

from pyinfra import host, logger


def skipped(step: str, reason: str) -> None:
    logger.warning(f"[{host.name}] skipped: {step}: {reason}")
