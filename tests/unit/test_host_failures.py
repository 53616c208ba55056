"""pyinfra_ext/host_failures.py: an exception on a host that pyinfra already failed, or whose SSH
connection is gone, ends that host only; any other exception still ends the run.

The fleet tests prove it with a real poweroff (tests/fleet/test_fleet_deploy.py); here each
branch alone, with pyinfra's per-host step replaced by one that raises as an operation body does
when its facts came back as defaults.
"""

from __future__ import annotations

import logging
import types

import pytest

from pyinfra_ext import host_failures


class SSHConnector:  # named as pyinfra's: connection_lost looks at paramiko's transport only for it
    def __init__(self, transport):
        self.client = None if transport is None else types.SimpleNamespace(get_transport=lambda: transport)


def transport(active: bool):
    return types.SimpleNamespace(is_active=lambda: active)


def state():
    meta = types.SimpleNamespace(names=["Checkpoint present"])
    return types.SimpleNamespace(failed_hosts=set(), get_op_meta=lambda op_hash: meta)


class Host:
    name, print_prefix = "node2", "[node2] "

    def __init__(self, connector):
        self.connector = connector


def body_raises(mark_failed: bool):
    def run(st, h, op_hash):
        if mark_failed:
            st.failed_hosts.add(h)  # pyinfra marked it while reading a fact that could not be read
        raise TypeError("'NoneType' object is not subscriptable")

    return run


@pytest.mark.parametrize(
    "connector,mark_failed",
    [
        (SSHConnector(transport(True)), True),  # pyinfra failed the host during the step
        (SSHConnector(transport(False)), False),  # the connection died
        (SSHConnector(None), False),  # never connected
    ],
)
def test_a_host_that_no_longer_answers_fails_alone(monkeypatch, caplog, connector, mark_failed):
    monkeypatch.setattr(host_failures, "_ORIGINAL", body_raises(mark_failed))
    with caplog.at_level(logging.ERROR, logger="pyinfra"):
        assert host_failures._run_host_op_with_context(state(), Host(connector), "h1") is False
    assert "[node2] Checkpoint present: stopped on this host, which no longer answers" in caplog.text


@pytest.mark.parametrize("connector", [SSHConnector(transport(True)), types.SimpleNamespace()])
def test_a_mistake_on_a_healthy_host_still_ends_the_run(monkeypatch, connector):
    monkeypatch.setattr(host_failures, "_ORIGINAL", body_raises(False))
    with pytest.raises(TypeError):
        host_failures._run_host_op_with_context(state(), Host(connector), "h1")


def test_a_host_failed_before_this_step_fails_alone(monkeypatch):
    monkeypatch.setattr(host_failures, "_ORIGINAL", body_raises(False))
    st, h = state(), Host(SSHConnector(transport(True)))
    st.failed_hosts.add(h)
    assert host_failures._run_host_op_with_context(st, h, "h1") is False


@pytest.mark.parametrize("failed_before", [False, True])
def test_a_step_that_returns_passes_through(monkeypatch, failed_before):
    """What pyinfra's step returns reaches pyinfra unchanged (the very object, not a truthy
    stand-in), from the step called once with the same state, host and operation; a host
    already failed whose step returns is not turned into a failure either."""
    calls, answers = [], []

    def step(st, h, op_hash):
        calls.append((st, h, op_hash))
        answers.append(object())  # a new object each call: only the step's own answer is identical
        return answers[-1]

    monkeypatch.setattr(host_failures, "_ORIGINAL", step)
    st, h = state(), Host(SSHConnector(None))  # a connector that would count as lost
    if failed_before:
        st.failed_hosts.add(h)
    first = host_failures._run_host_op_with_context(st, h, "h1")
    second = host_failures._run_host_op_with_context(st, h, "h2")
    assert calls == [(st, h, "h1"), (st, h, "h2")]
    assert first is answers[0] and second is answers[1] and first is not second
