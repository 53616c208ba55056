"""pyinfra_ext/memo.py after a change: which wanted facts a stale read brings with it.

Before the run's first change on a host, the first read brings every wanted fact. After a change
every held value is stale; reading them one by one was one SSH round trip each (a deploy that
changed one early file sent 107 commands where the converged run sends 2). Here memo's own
fact() runs for a stand-in host whose change count the test sets, with _read_together replaced by
a recorder (the real one, its parsing and its equality with pyinfra's own reads, is
tests/sandbox/test_fact_memo.py's, after a change too).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from pyinfra.facts.files import File

from pyinfra_ext import memo


class State:
    ops: dict = {}


@pytest.fixture
def fleet(monkeypatch, tmp_path):
    """A host with 100 wanted facts (in the order the last run read them), a change counter the
    test moves, and every command recorded: ("batch", n keys) or ("alone", path)."""
    monkeypatch.setenv("GLM_FLASH_CACHE", str(tmp_path))  # no facts cache: the plan's wants only
    h = SimpleNamespace(name="node1", state=State(), data={})
    sent, now = [], [0]
    monkeypatch.setattr(memo, "changes", lambda state, host: now[0])

    def together(host, facts):
        sent.append(("batch", len(facts)))
        return {k: f"{json_path(k)}@{now[0]}" for k in facts}

    def alone(cls, **kw):
        sent.append(("alone", kw["path"]))
        return f"{kw['path']}@{now[0]}"

    monkeypatch.setattr(memo, "_read_together", together)
    h.get_fact = alone
    paths = [f"/f{i}" for i in range(100)]
    for p in paths:
        memo.want(h, File, path=p)
    return h, paths, sent, now


def json_path(key) -> str:
    return key[2].split('"')[3]


def read(h, path):
    return memo.fact(h, File, path=path)


def test_before_any_change_the_first_read_brings_every_wanted_fact(fleet):
    h, paths, sent, now = fleet
    assert [read(h, p) for p in paths] == [f"{p}@0" for p in paths]
    assert sent == [("batch", 100)]


def test_after_a_change_the_rest_of_the_run_comes_in_growing_windows(fleet):
    h, paths, sent, now = fleet
    read(h, paths[0])
    now[0] = 1  # an operation changed the host: every value held is stale
    sent.clear()
    # the reads after the change get the host as it is now, never a value from before it
    assert [read(h, p) for p in paths[10:]] == [f"{p}@1" for p in paths[10:]]
    assert sent == [("batch", 8), ("batch", 16), ("batch", 32), ("batch", 34)]


def test_a_run_that_changes_the_host_at_every_read_reads_a_few_at_a_time(fleet):
    h, paths, sent, now = fleet
    read(h, paths[0])
    sent.clear()
    for i, p in enumerate(paths[1:40], start=1):
        now[0] = i
        assert read(h, p) == f"{p}@{i}"
    # each window read before a change: halved, down to reads alone (no fact read for nothing)
    assert [n for kind, n in sent if kind == "batch"] == [8, 4, 2], sent
    assert len(sent) == 39  # one command per read, as pyinfra's own reads would be
    # once the changes stop, the windows grow again
    sent.clear()
    assert [read(h, p) for p in paths[40:]] == [f"{p}@39" for p in paths[40:]]
    assert sent == [("batch", 2), ("batch", 4), ("batch", 8), ("batch", 16), ("batch", 30)], sent


def test_a_fact_no_run_declared_is_read_alone(fleet):
    h, paths, sent, now = fleet
    read(h, paths[0])
    now[0] = 1
    sent.clear()
    assert read(h, "/not-wanted") == "/not-wanted@1"
    assert sent == [("alone", "/not-wanted")]
