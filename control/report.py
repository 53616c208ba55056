"""Say plainly what a run did not do on this host, and why; kept in the run's record
(control/run_record.py) for the end-of-deploy summary (roles/summary.py prints them)."""

from pyinfra import host, logger

from control import run_record


def skipped(step: str, reason: str) -> None:
    logger.warning(f"[{host.name}] skipped: {step}: {reason}")
    done = run_record.current().skipped[host.name]
    if (step, reason) not in done:
        done.append((step, reason))
