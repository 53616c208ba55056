"""pyinfra_ext/op_order.py gives the numbers pyinfra's own get_operation_order_from_stack gives.

A deploy-like file (nested role functions, loops, a `with` block, calls spread over several
lines, a generator) calls a probe at each point where an operation would be called; the probe
asks pyinfra's function and ours on one line, so both see the same stack.
"""

from __future__ import annotations

import types

import pyinfra
import pytest

from pyinfra_ext import op_order

DEPLOY = '''
import contextlib


def role(probe, state, out):
    for i in range(2):
        out.append(probe(state))
    with contextlib.nullcontext():
        out.append(
            probe(
                state,
            )
        )
    out.extend(inner(probe, state))


def inner(probe, state):
    yield probe(state)
    yield (lambda: probe(state))()


def run(probe, state, out):
    role(
        probe,
        state,
        out,
    )
    out.append(probe(state))
'''


def probe(state):
    return util_original(state), op_order.operation_order(state)


util_original = op_order._ORIGINAL


def run_deploy(tmp_path, deploy_filename: str | None, is_cli: bool):
    path = tmp_path / "deploy.py"
    path.write_text(DEPLOY)
    namespace: dict = {}
    exec(compile(DEPLOY, str(path), "exec"), namespace)
    filename = str(path) if deploy_filename == "the file" else deploy_filename
    state = types.SimpleNamespace(current_deploy_filename=filename, current_op_file_number=7)
    out: list = []
    saved = pyinfra.is_cli
    pyinfra.is_cli = is_cli
    try:
        namespace["run"](probe, state, out)
    finally:
        pyinfra.is_cli = saved
    return out


@pytest.mark.parametrize("deploy_filename", ["the file", None, "/elsewhere/deploy.py"])
@pytest.mark.parametrize("is_cli", [True, False])
def test_same_numbers_as_pyinfra(tmp_path, deploy_filename, is_cli):
    pairs = run_deploy(tmp_path, deploy_filename, is_cli)
    assert len(pairs) == 6
    for theirs, ours in pairs:
        assert ours == theirs
    if deploy_filename == "the file":
        orders = [ours for _, ours in pairs]
        assert len(set(map(tuple, orders))) == 5  # the two loop turns share a line; pyinfra numbers those
        assert orders == sorted(orders)  # the deploy file's order


def test_installed_where_pyinfra_looks_it_up(monkeypatch):
    """Another pyinfra is refused when pyinfra_ext loads (tests/unit/test_pyinfra_ext.py)."""
    module = op_order._operation
    monkeypatch.setattr(module, "get_operation_order_from_stack", op_order._ORIGINAL)
    op_order.install()
    assert module.get_operation_order_from_stack is op_order.operation_order
