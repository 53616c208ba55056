"""Every unit of ours that systemd holds on the host, the transient jobs and the failure notifier's
instances among them, is sandboxed at most as exposed as its row of the table in docs/host.md
("Every unit's sandboxing") allows, by systemd's own measure (`systemd-analyze security`: 0 best,
10 worst). A unit of ours the table does not name fails: a new unit comes with its row.

    pytest tests/host/test_exposure.py --no-deploy --inventory inventory/l40s.py --hosts ssh://root@gpu1

Runs on a node and on a fleet's gateway alike (no profile is read). The transient units (a build,
the download, the flag check, a fleet's peer transfers) are gone once they end, so on a node each
is also started here as a `sleep` with the very properties the deploy gives it
(roles/operations/sandboxing.py), scored, and stopped.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex

import pytest

from roles.operations import sandboxing
from tests.conftest import REPO

DOC = REPO / "docs" / "host.md"
SECTION = "## Every unit's sandboxing"
# Ours: named glm-flash*, and Debian's node exporter, which runs on our drop-in.
PATTERNS = ("glm-flash*.service", "prometheus-node-exporter.service")


def bounds() -> dict[str, float]:
    """The table's rows: unit (a glob for instances and jobs) -> the most exposure it may have."""
    text = DOC.read_text()
    assert SECTION in text, f"{DOC} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([0-9.]+) \|", body, flags=re.M)
    assert rows, f"no rows in {DOC}'s table"
    return {unit: float(bound) for unit, bound in rows}


def exposure(host, unit: str) -> tuple[float, str]:
    out = host.run(f"systemd-analyze security --no-pager {unit}")
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out.stdout)
    assert out.rc == 0 and m, f"systemd-analyze security {unit}: {out.stderr or out.stdout[-500:]}"
    return float(m.group(1)), out.stdout


def test_the_table_parses_and_names_every_unit_template_of_ours():
    table = bounds()
    for unit in table:
        assert unit.endswith(".service"), unit
    templates = sorted(p.name.removesuffix(".j2") for p in (REPO / "templates").glob("*.service.j2"))
    missing = [t for t in templates if not any(fnmatch.fnmatch(t.replace("@.", "@x."), u) for u in table)]
    assert not missing, f"units the repo writes with no row in {DOC}: {missing}"


def test_every_loaded_unit_of_ours_is_within_its_documented_exposure(host):
    table = bounds()
    listed = host.check_output("systemctl list-units --all --plain --no-legend --full " + " ".join(PATTERNS))
    units = sorted({line.split()[0] for line in listed.splitlines() if line.strip()})
    assert any(u.startswith("glm-flash") for u in units), f"no unit of ours is loaded here: {listed!r}"
    over, undocumented, measured = [], [], {}
    for unit in units:
        rows = [pattern for pattern in table if fnmatch.fnmatch(unit, pattern)]
        if not rows:
            undocumented.append(unit)
            continue
        score, report = exposure(host, unit)
        measured[unit] = score
        if score > table[rows[0]]:
            over.append(f"{unit}: {score} > {table[rows[0]]} ({rows[0]})\n{report[-1500:]}")
    print("exposure:", measured)
    assert not undocumented, f"units of ours with no row in {DOC} ({SECTION}): {undocumented}"
    assert not over, "\n".join(over)


# Each transient unit of the deploy: a name its glob in the table matches, and its properties.
TRANSIENTS = {
    "glm-flash-job-exposure-build.service": sandboxing.root_job(["/var/tmp"]),
    "glm-flash-job-exposure-fetching-build.service": sandboxing.root_job(["/var/tmp"], network=True),
    "glm-flash-model-download-exposure.service": [*sandboxing.fetch_unit(["/var/tmp"]), "User=nobody"],
    "glm-flash-flag-check-exposure.service": sandboxing.engine_check("nobody"),
    "glm-flash-peer-fetch-exposure.service": sandboxing.peer_fetch(),
    "glm-flash-peer-serve-exposure.service": sandboxing.peer_server(),
}


@pytest.mark.parametrize("unit", sorted(TRANSIENTS))
def test_each_transient_unit_is_within_its_documented_exposure(host, unit):
    if not host.run("systemctl cat glm-flash.service").rc == 0:
        pytest.skip("not applicable: this host runs no engine (a fleet's gateway): no transient unit of ours runs here")
    table = bounds()
    rows = [pattern for pattern in table if fnmatch.fnmatch(unit, pattern)]
    assert rows, f"{unit}: no row in {DOC} ({SECTION})"
    name = unit.replace("exposure", f"exposure-{os.getpid()}")
    props = " ".join(f"-p {shlex.quote(p)}" for p in TRANSIENTS[unit])
    started = host.run(f"systemd-run --quiet --collect --service-type=exec --unit={name} {props} /bin/sleep 120")
    assert started.rc == 0, started.stderr
    try:
        score, report = exposure(host, name)
    finally:
        host.run(f"systemctl stop {name}")
    print(f"exposure: {unit} {score}")
    assert score <= table[rows[0]], f"{unit}: {score} > {table[rows[0]]} ({rows[0]})\n{report[-1500:]}"
