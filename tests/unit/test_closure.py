"""The closure hash (files/glm-flash closure) and the summary's grouping by it (roles/summary.py)."""

from __future__ import annotations

from roles.summary import closures, host_summary
from tests.conftest import host_tool


def _load():
    return host_tool("glm-flash", "glm_flash_closure")


st = _load()
UNIT = "# /etc/systemd/system/glm-flash.service\n[Service]\nIPAddressAllow=localhost {own} 10.0.0.2\n"
ENV = "HOME=/var/lib/glm-flash\nHF_HUB_OFFLINE=1\n"
FLAGS = '{"args": ["--host", "{own}", "--port", "30000"]}\n'


def texts(own: str, unit_extra: str = "") -> dict:
    return {
        "driver": '{"branch": "580"}',
        "toolkit": '{"cuda": "13.0"}',
        "engine": "0.7.0.post1-abcdef",
        "patches": "# kt.json\n{}",
        "model": '{"commit": "' + "a" * 40 + '"}',
        "drafter": "{}",
        "unit": UNIT.replace("{own}", own) + unit_extra,
        "env": ENV,
        "flags": FLAGS.replace("{own}", own),
    }


def test_two_workers_from_one_commit_have_one_closure_and_an_edit_changes_it_in_its_part():
    a = st.closure_parts(texts("10.0.0.11"), "10.0.0.11")
    b = st.closure_parts(texts("10.0.0.12"), "10.0.0.12")
    assert a == b and a["closure"].startswith("sha256:") and set(a["parts"]) == set(st.CLOSURE_PARTS)
    # Without the placeholder the own address would split them: the test would see it.
    assert st.closure_parts(texts("10.0.0.11"))["closure"] != st.closure_parts(texts("10.0.0.12"))["closure"]
    dropin = "# /etc/systemd/system/glm-flash.service.d/x.conf\n[Service]\nEnvironment=X=1\n"
    c = st.closure_parts(texts("10.0.0.12", dropin), "10.0.0.12")
    assert c["closure"] != a["closure"]
    assert [p for p in a["parts"] if a["parts"][p] != c["parts"][p]] == ["unit"]


def test_an_address_that_only_starts_like_the_own_one_is_kept():
    one = st.closure_parts({"unit": "allow 10.0.0.1 10.0.0.12"}, "10.0.0.1")
    two = st.closure_parts({"unit": "allow 10.0.0.2 10.0.0.12"}, "10.0.0.2")
    assert one == two  # 10.0.0.12 is not 10.0.0.1 with a digit after it


def test_the_status_item_carries_the_closure_and_its_parts_as_fields():
    c = st.closure_parts(texts("10.0.0.11"), "10.0.0.11")
    it = st.decide_closure(c)
    assert (
        it["item"] == "closure"
        and it["state"] == "ok"
        and it["fields"] == {"closure": c["closure"], "parts": c["parts"]}
    )
    s = host_summary({}, {"items": [it]}, [])
    assert s["closure"] == c["closure"] and s["closure_parts"] == c["parts"]


def test_the_summary_groups_hosts_by_closure_and_names_the_drifted_part():
    same = st.closure_parts(texts("10.0.0.11"), "10.0.0.11")
    edited = st.closure_parts(texts("10.0.0.13", "# drop-in\n"), "10.0.0.13")
    hosts = {
        "node2": {"closure": same["closure"], "closure_parts": same["parts"]},
        "node3": {"closure": same["closure"], "closure_parts": same["parts"]},
        "node4": {"closure": edited["closure"], "closure_parts": edited["parts"]},
        "gw": {"closure": None},
    }
    lines = closures(hosts)
    assert f"{same['closure']}: node2, node3" in lines and f"{edited['closure']}: node4" in lines
    assert f"node4 drifted from {same['closure']} in: unit" in lines
    assert closures({"gw": {}}) == []


def test_the_unit_part_reads_the_unit_and_its_drop_ins(monkeypatch, tmp_path):
    unit, dropin = tmp_path / "glm-flash.service", tmp_path / "x.conf"
    unit.write_text("[Service]\n")
    dropin.write_text("[Service]\nEnvironment=X=1\n")

    def fake_run(cmd, timeout=600):
        if cmd[-1] == "glm-flash.service":
            return 0, f"FragmentPath={unit}\nDropInPaths={dropin}\n"
        return 0, "FragmentPath=\nDropInPaths=\n"

    monkeypatch.setattr(st, "run", fake_run)
    text = st.unit_files()
    assert f"# {unit}\n[Service]\n" in text and f"# {dropin}\n[Service]\nEnvironment=X=1\n" in text
