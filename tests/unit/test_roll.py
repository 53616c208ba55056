"""roles/fleet/roll.py's Roll with a router API stand-in (the real router: tests/fleet/test_fleet_roll*.py)."""

from __future__ import annotations

from roles.fleet.roll import Roll, Unreachable


class Api:
    def __init__(self, urls, reachable=True):
        self.listed, self.reachable, self.calls = list(urls), reachable, []

    def remove(self, url, timeout_s):
        if not self.reachable:
            raise Unreachable("down")
        self.calls.append(("remove", url))
        self.listed.remove(url)

    def add(self, url, timeout_s):
        if not self.reachable:
            raise Unreachable("down")
        self.calls.append(("add", url))
        if url not in self.listed:
            self.listed.append(url)

    def find(self, url):
        if not self.reachable:
            raise Unreachable("down")
        return {"url": url} if url in self.listed else None


def test_each_worker_is_out_while_it_restarts_and_back_after():
    api = Api(["a", "b"])
    roll = Roll(api, drain_s=0)
    seen = []
    for url in ("a", "b"):
        assert roll.restart(url, url, lambda u=url: seen.append(api.find(u)) or True, serving=True)
    assert seen == [None, None] and api.calls == [("remove", "a"), ("add", "a"), ("remove", "b"), ("add", "b")]
    assert roll.most_out == 1 and sorted(api.listed) == ["a", "b"]


def test_a_failed_restart_stops_the_roll_and_leaves_the_worker_out():
    api = Api(["a", "b"])
    roll = Roll(api, drain_s=0)
    assert not roll.restart("a", "a", lambda: False, serving=True)
    touched = []
    assert not roll.restart("b", "b", lambda: touched.append("b") or True, serving=True)
    assert touched == [] and api.listed == ["b"] and roll.failed == ["a"]


def test_without_a_gateway_the_engine_restarts_as_on_a_single_node():
    roll = Roll(Api(["a"], reachable=False), drain_s=0)
    assert roll.restart("a", "a", lambda: True, serving=True) and not roll.failed
    assert roll.back_in("a")  # nothing to put back from here


def test_a_worker_that_was_not_serving_is_started_then_put_in():
    api = Api([])
    roll = Roll(api, drain_s=0)
    assert roll.restart("a", "a", lambda: True, serving=False) and api.calls == [("add", "a")]
    assert not Roll(Api([]), drain_s=0).restart("b", "b", lambda: False, serving=False)
