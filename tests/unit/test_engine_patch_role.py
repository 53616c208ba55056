"""The patch, flag and model checks (roles/facts/engine.py, roles/facts/model.py): fact parsers on real tool output.

The tools run here for real (glm-flash-patch, glm-flash-model-fetch check); their output is
fed to the facts' parsers exactly as pyinfra would after running the fact command.
"""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from roles.facts.engine import EnginePatchCheck, LaunchFlagCheck  # noqa: E402
from roles.facts.model import ModelCheck  # noqa: E402
from roles.operations.engine_patches import engine_patched  # noqa: E402


def test_patch_check_fact_parses_real_output(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    s = tmp_path / "s.json"
    s.write_text(
        json.dumps(
            {
                "name": "n",
                "package": "p",
                "version": "1",
                "root": str(tmp_path),
                "files": [{"path": "a.py", "edits": [{"id": "e", "anchor": "x = 1\n", "replace": "x = 2\n"}]}],
            }
        )
    )
    cmd = f"{REPO}/files/glm-flash-patch check --json {s} 2>&1; echo \"exit=$?\""
    env = {"GLM_FLASH_STATE_DIR": str(tmp_path / "st"), "PATH": "/usr/bin:/bin"}

    def check() -> str:
        return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env).stdout

    out = check()
    fact = EnginePatchCheck
    got = fact.parse(out.splitlines())
    assert got["exit"] == 1 and got["files"][str(tmp_path / "a.py")]["state"] == "pending"
    (tmp_path / "a.py").write_text("y = 1\n")
    out = check()
    got = fact.parse(out.splitlines())
    assert got["exit"] == 2 and any("refused" in line for line in got["lines"])
    assert fact.parse(["missing"])["exit"] is None


def test_flag_and_model_fact_parsers(tmp_path):
    fact = LaunchFlagCheck
    got = fact.parse(["some warning", "glm-flash-check-flags: sglang.launch_server: unknown flag --x", "exit=1"])
    assert got["exit"] == 1 and got["lines"][-1].endswith("unknown flag --x")
    assert fact.parse(["missing"])["exit"] is None
    out = subprocess.run(
        ["sh", "-c", f"python3 {REPO}/files/glm-flash-model-fetch check --dest {tmp_path}/none; echo \"exit=$?\""],
        capture_output=True,
        text=True,
    ).stdout
    mfact = ModelCheck
    got = mfact.parse(out.splitlines())
    assert got["exit"] == 1 and got["state"] == "incomplete" and "does not exist" in got["reason"]


def test_patch_op_applies_only_when_needed():
    sys.path.insert(0, str(REPO / "tests" / "unit"))
    from fakehost import commands

    fact, op = EnginePatchCheck, engine_patched
    sets = ["/e/glm-flash-patches/sglang-kt-0.7.2.json", "/e/glm-flash-patches/m.json"]
    apply = "/opt/glm-flash/bin/glm-flash-patch apply " + " ".join(sets)
    done = {"exit": 0, "files": {"/a": {"state": "applied"}}, "lines": []}
    assert commands(op, {fact: done}, tool="/opt/glm-flash/bin/glm-flash-patch", sets=sets) == []
    for state in (
        {"exit": 1, "files": {}, "lines": []},
        {"exit": None, "files": {}, "lines": []},
        {"exit": 2, "files": {}, "lines": ["refused"]},
    ):
        assert commands(op, {fact: state}, tool="/opt/glm-flash/bin/glm-flash-patch", sets=sets) == [apply]
