"""roles/cuda_header.py and its operation and fact: the --check fact, the fix operation from given facts, the dpkg hook.

The fact parser is fed the real output of glm-flash-fix-cuda-header (run here on a copy of
the real 12.8 header); the hook is parsed by this machine's apt-config and its command line
run by sh with a fix command that fails, to show apt would still succeed.
"""

import os
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from fakehost import FakeHost, Recorder, commands, on, render

from control.profile import build
from roles import cuda_header
from roles.facts.system import CudaHeaderCheck
from roles.operations.cuda_header import headers_fixed

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
import cuda_assets  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TOOL = "/opt/glm-flash/bin/glm-flash-fix-cuda-header"


def fact_output(tmp_path, glibc, text=None):
    """Run the fact's shell command for real against a tree holding the 12.8 header."""
    header = tmp_path / "usr-local/cuda-12.8/targets/x86_64-linux/include/crt/math_functions.h"
    header.parent.mkdir(parents=True, exist_ok=True)
    header.write_text(text or cuda_assets.header_12_8())
    wrapper = tmp_path / "fix"
    wrapper.write_text(
        f"#!/bin/sh\nexec {sys.executable} {REPO / 'files' / cuda_header.TOOL} "
        f"--prefix {tmp_path / 'usr-local'} \"$@\"\n"
    )
    wrapper.chmod(0o755)
    env = dict(
        os.environ,
        GLM_FLASH_GLIBC_VERSION=glibc,
        GLM_FLASH_STATE_DIR=str(tmp_path / "state"),
        GLM_FLASH_PATCH_TOOL=str(REPO / "files/glm-flash-patch"),
        GLM_FLASH_CUDA_HEADER_SET=str(cuda_assets.patch_set_json(tmp_path / "set.json")),
    )
    cmd = CudaHeaderCheck().command(str(wrapper)).get_raw_value()
    r = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env)
    assert r.returncode == 0, "the fact command itself must not fail"
    return r.stdout.splitlines(), header, env, wrapper


def test_fact_on_real_command_output(tmp_path):
    lines, header, env, wrapper = fact_output(tmp_path, "2.41")
    state = CudaHeaderCheck.parse(lines)
    assert state == {"exit": 1, "lines": [f"needs fix {header} (glibc 2.41)"]}
    subprocess.run([str(wrapper)], env=env, check=True, capture_output=True)
    cmd = CudaHeaderCheck().command(str(wrapper)).get_raw_value()
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env).stdout.splitlines()
    assert CudaHeaderCheck.parse(out) == {"exit": 0, "lines": [f"already fixed {header}"]}


def test_fact_old_glibc_and_missing_tool(tmp_path):
    lines, header, _, _ = fact_output(tmp_path, "2.36")
    assert CudaHeaderCheck.parse(lines)["exit"] == 0
    r = subprocess.run(
        ["sh", "-c", CudaHeaderCheck().command(str(tmp_path / "nope")).get_raw_value()], capture_output=True, text=True
    )
    assert CudaHeaderCheck.parse(r.stdout.splitlines()) == {"exit": None, "lines": []}


def test_fact_refused_header(tmp_path):
    text = cuda_assets.header_12_8().replace("sinpi(double x);", "sinpi(double x) noexcept (true);")
    lines, _, _, _ = fact_output(tmp_path, "2.41", text)
    state = CudaHeaderCheck.parse(lines)
    assert state["exit"] == 2 and any("edited by hand" in line for line in state["lines"])


@pytest.mark.parametrize("exit_code", [None, 1, 2])
def test_fix_runs_when_needed_or_unknown(exit_code):
    assert commands(headers_fixed, {CudaHeaderCheck: {"exit": exit_code, "lines": []}}, tool=TOOL) == [TOOL]


def test_fix_is_a_noop_when_check_passes():
    fake = FakeHost({CudaHeaderCheck: {"exit": 0, "lines": ["already fixed /usr/local/cuda-12.8/x.h"]}})
    with on(fake):
        assert [render(c) for c in headers_fixed._inner(tool=TOOL)] == []
    assert fake.noops == ["CUDA 12.x headers: already fixed /usr/local/cuda-12.8/x.h"]


def test_apply_issues_install_hook_and_fix(monkeypatch):
    import inspect

    from roles.operations import paths

    calls = []
    # Our path operations, recorded with their arguments by name (as the role passes them or not).
    for op in ("directory", "link", "put", "template", "absent"):
        bind = inspect.signature(getattr(paths, op)).bind
        kind = "file" if op == "absent" else op
        monkeypatch.setattr(
            paths, op, lambda *a, _b=bind, _k=kind, **kw: calls.append((_k, dict(_b(*a, **kw).arguments)))
        )
    monkeypatch.setattr(cuda_header, "skipped", lambda *a: calls.append(("skipped", a)))
    fake = FakeHost({CudaHeaderCheck: {"exit": 1, "lines": []}})
    rec = Recorder(fake)
    rec.patch(monkeypatch, cuda_header)
    with on(fake):
        cuda_header.apply(build("gpu1", {}))
    dests = [kw.get("dest") or kw.get("path") for _, kw in calls]
    assert "/opt/glm-flash/bin/glm-flash-fix-cuda-header" in dests
    assert "/opt/glm-flash/patches/cuda/math_functions-12.json" in dests
    assert "/etc/apt/apt.conf.d/60glm-flash-cuda-header" in dests
    assert rec.calls == [("headers_fixed", [TOOL])]

    calls.clear()
    rec.calls.clear()
    with on(fake):
        cuda_header.apply(build("gpu1", {"fix_cuda_header": False}))
    assert [(op, kw.get("path")) for op, kw in calls if op == "file"] == [("file", cuda_header.HOOK)]
    assert rec.calls == [] and calls[-1][0] == "skipped"


def test_patch_set_json_round_trips():
    import json

    data = json.loads(cuda_header.patch_set_json())
    assert [e["id"] for e in data["files"][0]["edits"]] == ["sinpi", "sinpif", "cospi", "cospif"]
    assert data["files"][0]["fixed_upstream_if"] == ["__NV_IEC_60559_FUNCS_EXCEPTION_SPECIFIER"]


def hook_text(tool=TOOL, log=cuda_header.HOOK_LOG):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "templates"), undefined=jinja2.StrictUndefined)
    return env.get_template("apt/60glm-flash-cuda-header.j2").render(tool=tool, log=log)


def test_hook_parses_with_apt_config(tmp_path):
    conf = tmp_path / "hook.conf"
    conf.write_text(hook_text())
    r = subprocess.run(["apt-config", "-c", str(conf), "dump", "DPkg::Post-Invoke"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"{TOOL} --dpkg-hook" in r.stdout


def post_invoke_command(text):
    line = [line for line in text.splitlines() if line.startswith("DPkg::Post-Invoke")][0]
    return line.split('"', 1)[1].rsplit('"', 1)[0]


@pytest.mark.parametrize(
    "body,shown",
    [
        ("exit 3", "--dpkg-hook failed"),  # the command itself broken
        ("echo boom >&2; kill -9 $$", "--dpkg-hook failed"),
    ],
)
def test_hook_never_fails_apt(tmp_path, body, shown):
    tool = tmp_path / "fix"
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)
    r = subprocess.run(
        ["sh", "-c", post_invoke_command(hook_text(tool=str(tool), log=str(tmp_path / "log")))],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and shown in r.stderr
    # no command installed (role removed, or not deployed yet): silent success
    r = subprocess.run(
        ["sh", "-c", post_invoke_command(hook_text(tool=str(tmp_path / "none")))], capture_output=True, text=True
    )
    assert (r.returncode, r.stderr) == (0, "")


def run_hook(prefix, env: dict) -> subprocess.CompletedProcess:
    """The tool as dpkg's hook runs it."""
    return subprocess.run(
        [sys.executable, str(REPO / "files" / cuda_header.TOOL), "--dpkg-hook", "--prefix", str(prefix)],
        capture_output=True,
        text=True,
        env=env,
    )


def test_dpkg_hook_mode_logs_refusal_and_exits_zero(tmp_path):
    text = cuda_assets.header_12_8().replace("cospif(float x);", "cospif(float x) noexcept (true);")
    _, header, env, _ = fact_output(tmp_path, "2.41", text)
    log = tmp_path / "log" / "cuda-header.log"
    env["GLM_FLASH_HOOK_LOG"] = str(log)
    r = run_hook(tmp_path / "usr-local", env)
    assert r.returncode == 0
    assert "refused" in r.stderr and "FAILED after this dpkg run" in r.stderr and str(log) in r.stderr
    assert "refused" in log.read_text() and "Traceback" not in r.stderr
    # a header that needs the fix: fixed, said once on stderr and in the log
    header.write_text(cuda_assets.header_12_8())
    r = run_hook(tmp_path / "usr-local", env)
    assert r.returncode == 0 and r.stderr.strip() == f"glm-flash: fixed     {header}"
    assert log.read_text().count("fixed     ") == 1
    # nothing to do: silent
    r = run_hook(tmp_path / "usr-local", env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
