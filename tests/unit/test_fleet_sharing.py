"""The model role shares its checkpoints only as the run says: alone unless the fleet registered
its sharing for that run (roles/fleet/checkpoint.py, from deploy_fleet.py), and per run: another
pyinfra State in the same process is alone again."""

from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_state

from roles import model
from roles.fleet import checkpoint


def new_state() -> State:
    return State(Inventory(([], {})), Config())


def test_alone_unless_the_fleet_registered_for_this_run():
    assert model.sharing() is model.Alone  # no run
    assert model.Alone.plan(lambda h: True) == (None, [], [])
    first, second = new_state(), new_state()
    with ctx_state.use(first):
        assert model.sharing() is model.Alone
        checkpoint.share()
        assert model.sharing() is checkpoint
    with ctx_state.use(second):
        assert model.sharing() is model.Alone
    with ctx_state.use(first):
        assert model.sharing() is checkpoint
