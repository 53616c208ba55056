"""A host that goes away mid-run fails alone; the run goes on for the others.

pyinfra 3.10 runs an operation's body again when it executes it, reading facts there. When the
host stops answering (powered off, network gone), such a fact cannot be read: pyinfra logs it,
marks the host failed and hands the operation the fact's default (None for most of ours), on
which the body then raises. pyinfra catches exceptions of the commands it runs, not of the body,
so that exception leaves the host's greenlet and ends the run for every host, the reachable ones
half done (pyinfra.api.operations._run_single_op: greenlet.get()).

install() wraps pyinfra's per-host step so that an exception on a host pyinfra has already marked
failed in this run, or whose connection is gone, ends that host only: it is logged with the host's
name and the host counts as failed (the summary says why). Any other exception still ends the run
as before: a mistake in an operation is not hidden.
"""

from __future__ import annotations

from pyinfra import logger
from pyinfra.api import operations

_ORIGINAL = operations._run_host_op_with_context


def connection_lost(host) -> bool:
    """The host's SSH connection (paramiko's transport) is gone; False for other connectors."""
    connector = getattr(host, "connector", None)
    if type(connector).__name__ != "SSHConnector":
        return False
    client = getattr(connector, "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is None or not transport.is_active()


def _run_host_op_with_context(state, host, op_hash):
    failed_before = host in state.failed_hosts
    try:
        return _ORIGINAL(state, host, op_hash)
    except Exception as e:
        if not (failed_before or host in state.failed_hosts or connection_lost(host)):
            raise
        names = ", ".join(state.get_op_meta(op_hash).names)
        logger.error(f"{host.print_prefix}{names}: stopped on this host, which no longer answers ({e!r})")
        return False


def install() -> None:
    """Once per process; pyinfra looks the step up by name each time it runs an operation."""
    operations._run_host_op_with_context = _run_host_op_with_context
