"""What the roles learn for the summary is kept per run (control/run_record.py): two pyinfra
States in one process keep apart; outside a real run there is one record for the process."""

from pyinfra.api import Config, Inventory, State
from pyinfra.context import ctx_state

from control import run_record


def new_state() -> State:
    return State(Inventory(([], {})), Config())


def test_each_run_has_its_own_record():
    first, second = new_state(), new_state()
    with ctx_state.use(first):
        run_record.current().skipped["h1"].append(("step", "why"))
        run_record.current().seeded_by["h2"] = "h1"
    with ctx_state.use(second):
        assert run_record.current().skipped == {} and run_record.current().seeded_by == {}
    assert run_record.of(first).skipped["h1"] == [("step", "why")]
    assert run_record.of(first) is not run_record.of(second)


def test_outside_a_run_one_record_for_the_process():
    run_record.reset()
    assert run_record.of(None) is run_record.of(object()) is run_record.current()
    run_record.current().refused["h"].append("no")
    assert run_record.of(None).refused == {"h": ["no"]}
    run_record.reset()
    assert run_record.current().refused == {}
