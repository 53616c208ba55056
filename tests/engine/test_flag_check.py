"""files/glm-flash-check-flags against the real sglang-kt 0.7.0.post1 parser.

The parser lives in sglang/srt/server_args.py, whose imports need torch (which on Linux
loads the CUDA libraries from the nvidia-* wheels at import) and most of sglang's
dependencies. So the venv is the engine lock's own set of wheels (locks/engine/0.7.0.post1.txt,
fetched into the shared wheelhouse by roles/engine_lock.fetch, sha256 checked), minus the
ktransformers sdist and upstream transformers (transformers-kt owns transformers/), built
once under ${GLM_FLASH_CACHE}. No GPU is needed: the tool never constructs ServerArgs.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from roles import launch, profile  # noqa: E402
from roles.engine_lock import fetch, load_lock, lock_path  # noqa: E402

TOOL = REPO / "files" / "glm-flash-check-flags"
SET = "0.7.0.post1"


@pytest.fixture(scope="module")
def engine_python():
    import pypi  # tests/engine/pypi.py
    key = hashlib.sha256(lock_path(SET).read_bytes()).hexdigest()[:12]
    venv = pypi.cache_dir() / f"sglang-kt-{SET}-flagcheck-{key}-venv"
    marker = venv / ".complete"
    if not marker.exists():
        t0 = time.monotonic()
        _, pins = load_lock(SET)
        wheels = [w for w in fetch(pins, log=lambda *a: None)
                  if w.name.endswith(".whl") and not w.name.startswith("transformers-")]
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin/pip"), "install", "--quiet", "--no-compile", "--no-index", "--no-deps",
                        "--disable-pip-version-check", *map(str, wheels)], check=True,
                       env=dict(os.environ, PIP_CONFIG_FILE="/dev/null"))
        marker.write_text(f"built in {time.monotonic() - t0:.0f} s\n")
    return venv / "bin" / "python"


sys.path.insert(0, str(HERE))


def check(python, spec):
    return subprocess.run([str(python), str(TOOL), "--args-json", json.dumps(spec)], capture_output=True, text=True,
                          timeout=600)


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
    r = subprocess.run([sys.executable, str(TOOL), "--args-json", json.dumps(rendered_spec())],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cannot build sglang.launch_server's argument parser" in r.stderr
