"""Bad inventories end with a clear message before any host is contacted."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

CASES = {
    "typo in a key": ('{"tp_szie": 2}', ["tp_szie: unknown key", "did you mean 'tp_size'?"]),
    "wrong type": ('{"kt_cpuinfer": "152"}', ["kt_cpuinfer: '152' is str, expected a whole number"]),
    "out of range": ('{"mem_fraction_static": 1.5}', ["mem_fraction_static: 1.5 is above the maximum 0.95"]),
    "contradiction": (
        '{"pytorch_alloc_conf": "expandable_segments:True"}',
        ["pytorch_alloc_conf: expandable_segments with tp_size > 1"],
    ),
    "chunk that ran out of memory": (
        '{"chunked_prefill_size": 40960}',
        ["chunked_prefill_size: 40960 runs out of memory", "use 32768 or less"],
    ),
}


def write_inventory(tmp_path, data: str):
    path = tmp_path / "bad.py"
    path.write_text(
        textwrap.dedent(f"""
        from control.profile import hosts
        hosts = hosts(("gpu1.invalid", {data}))
    """)
    )
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_bad_inventory_stops_before_connecting(tmp_path, case):
    data, expected = CASES[case]
    run = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(write_inventory(tmp_path, data)), "deploy.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 2
    assert "no host was changed" in out
    for text in expected:
        assert f"gpu1.invalid: {text}" in out or text in out, out
    assert "Traceback" not in out
    assert "Connecting to hosts" not in out
