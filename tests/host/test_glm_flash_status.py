"""`glm-flash status --json` on the checked host: every item ok, or not applicable with a reason.

It runs on the host the tools other checks run from here (engine verify, patch check, model
check, readiness); this adds what they do not: the operator's one command agrees, and
nothing it can check is a problem. When something is, the failure lists each with its fix.
"""

import json

import pytest

STATES = {"ok": "ok", "problem": "PROBLEM", "n/a": "n/a"}


@pytest.fixture(scope="module")
def status(host):
    out = host.run("glm-flash status --json")
    assert out.stdout.strip(), f"glm-flash status printed nothing (exit {out.rc}): {out.stderr}"
    return out.rc, json.loads(out.stdout)


def test_every_item_is_ok_or_not_applicable(status):
    rc, report = status
    problems = [f"{it['item']}: {it['detail']} Fix: {it['fix']}" for it in report["items"] if it["state"] == "problem"]
    assert not problems, "glm-flash status found problems:\n" + "\n".join(problems)
    assert rc == 0 and report["ok"]
    for it in report["items"]:
        assert it["state"] in STATES
        if it["state"] == "n/a":
            assert it["detail"].strip(), f"{it['item']}: not applicable without a reason"


def test_text_output_has_one_line_per_item(host, status):
    _, report = status
    lines = host.run("glm-flash status").stdout.splitlines()
    assert [line.split()[0] for line in lines] == [STATES[it["state"]] for it in report["items"]]
    assert all(f" {it['item']}: " in line for line, it in zip(lines, report["items"]))


def test_profile_values_file_is_roots_and_holds_no_secret(host):
    f = host.file("/etc/glm-flash/status.json")
    assert not f.is_symlink and (f.user, f.group, f.mode) == ("root", "root", 0o644)
    keys = json.loads(f.content_string)
    assert not [k for k in keys if "token" in k or "api_key" in k or "password" in k]
