"""files/glm-flash-check-flags against the real sglang-kt 0.7.0.post1 parser, as the deploy runs it:
with the engine environment the sandbox deploy built from the lock (real wheels, no GPU; the
tool never constructs ServerArgs, so nothing needs CUDA)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest

from control import profile
from roles.engines.kt import launch
from tests.conftest import REPO

TOOL = REPO / "files" / "glm-flash-check-flags"
SET = "0.7.0.post1"
ENGINE_PYTHON = "/opt/glm-flash/engine/current/bin/python"
pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def engine_python(sandbox):
    return ENGINE_PYTHON


def check(python, spec):
    command = f"{python} /opt/glm-flash/bin/glm-flash-check-flags --args-json {shlex.quote(json.dumps(spec))}"
    return subprocess.run(
        ["ssh", "-F", str(REPO / ".sandbox/ssh_config"), "sandbox", command],
        capture_output=True,
        text=True,
        timeout=600,
    )


def rendered_spec(**data):
    prof = profile.build("t", {"engine_set": SET, **data})
    return launch.launch_spec(prof, 2)


def test_the_rendered_flags_are_accepted(engine_python):
    spec = rendered_spec()
    assert "--kt-weight-path" in spec["args"] and "--kt-threadpool-count" in spec["args"]
    r = check(engine_python, spec)
    assert r.returncode == 0, r.stderr
    assert "accepted by sglang.launch_server (sglang-kt 0.7.0.post1)" in r.stdout


def test_unknown_flag_and_bad_value_are_refused_clearly(engine_python):
    spec = rendered_spec()
    bad = dict(spec, args=spec["args"] + ["--kt-cpu-infer", "152", "--tp", "2"])
    r = check(engine_python, bad)
    assert r.returncode == 1
    assert "unknown flag --kt-cpu-infer (did you mean --kt-cpuinfer?)" in r.stderr
    assert "the service was not (re)started" in r.stderr and "Traceback" not in r.stderr
    args = list(spec["args"])
    args[args.index("--context-length") + 1] = "512k"
    r = check(engine_python, dict(spec, args=args))
    assert r.returncode == 1 and "--context-length" in r.stderr and "512k" in r.stderr


def test_a_module_without_a_known_parser_cannot_be_checked(engine_python):
    r = check(engine_python, {"module": "vllm.entrypoints.cli", "args": []})
    assert r.returncode == 2 and "no parser known" in r.stderr


def test_without_the_engine_it_says_it_cannot_check(tmp_path):
    # the control machine's venv has no sglang: exit 2, not a false "ok"
    r = subprocess.run(
        [sys.executable, str(TOOL), "--args-json", json.dumps(rendered_spec())], capture_output=True, text=True
    )
    assert r.returncode == 2 and "cannot build sglang.launch_server's argument parser" in r.stderr


def test_engine_extra_args_checked_by_the_engines_parser(engine_python):
    """engine_extra_args (issue 39): a known flag is accepted; an unknown one is refused by name;
    one that sets what the profile's flags set is refused whatever name or alias it uses (sglang's
    --tp for the profile's --tp-size, --model for --model-path), which the deploy's own name
    check (roles/engines/common.py) cannot see."""
    ok = rendered_spec(engine_extra_args=["--schedule-policy", "lpm", "--enable-cache-report"])
    assert ok["args"][-3:] == ["--schedule-policy", "lpm", "--enable-cache-report"]
    r = check(engine_python, ok)
    assert r.returncode == 0, r.stderr
    unknown = rendered_spec(engine_extra_args=["--schedule-polcy", "lpm"])
    r = check(engine_python, unknown)
    assert r.returncode == 1 and "unknown flag --schedule-polcy (did you mean --schedule-policy?)" in r.stderr
    for alias, dest in (["--tp", "tensor_parallel_size"], ["--model", "model_path"]):
        r = check(engine_python, rendered_spec(engine_extra_args=[alias, "4"]))
        assert r.returncode == 1, r.stdout
        assert f"engine_extra_args: {alias} sets {dest!r}, which the profile's own flags set" in r.stderr


def test_engine_extra_args_through_the_deploy(sandbox):
    """The knob end to end (issue 39): a flag the installed engine does not know stops the deploy
    at the flag check, naming it, before the switch: launch.json is untouched; a known one reaches
    launch.json after the parser accepted it; the inventory's own settings put it back."""
    from tests.conftest import SANDBOX_INVENTORY, pyinfra, sandbox_sh

    def launch():
        return json.loads(sandbox_sh("cat /etc/glm-flash/launch.json").stdout)

    before = launch()
    assert "extra_args" not in before
    try:
        bad = pyinfra(SANDBOX_INVENTORY, "deploy.py", "--data", 'engine_extra_args=["--schedule-polcy","lpm"]')
        assert bad.returncode != 0
        assert "unknown flag --schedule-polcy (did you mean --schedule-policy?)" in bad.stdout + bad.stderr
        assert launch() == before
        good = pyinfra(SANDBOX_INVENTORY, "deploy.py", "--data", 'engine_extra_args=["--schedule-policy","lpm"]')
        assert good.returncode == 0, good.stderr[-3000:]
        now = launch()
        assert now["args"] == before["args"] + ["--schedule-policy", "lpm"]
        assert now["extra_args"] == ["--schedule-policy", "lpm"]
    finally:
        restore = pyinfra(SANDBOX_INVENTORY, "deploy.py")
        assert restore.returncode == 0, restore.stderr[-3000:]
    assert launch() == before
