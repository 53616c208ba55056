"""The engine patch sets against the real sglang-kt wheels from PyPI (0.7.0.post1, post4, 0.7.2).

Wheels are fetched once into ${GLM_FLASH_CACHE:-~/.cache/glm-flash}/wheels (sha256 checked
against PyPI) and only the files the sets touch are taken out of each. The sets are rendered by
control/patch_sets.py from a profile, exactly as a deploy uploads them, and applied by the real
files/glm-flash-patch. The checkpoint is never edited: post1's refusal of the checkpoint's
index_share_for_mtp_iteration is an edit to its model file, which then is post4's as Python.
"""

from __future__ import annotations
import __future__

import ast
import hashlib
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import pypi  # noqa: E402

from control import layout, patch_sets, profile  # noqa: E402
from sandbox import fake_model  # noqa: E402

TOOL = REPO / "files" / "glm-flash-patch"
VERSIONS = ["0.7.0.post1", "0.7.0.post4", "0.7.2"]
KPOOL = "sglang/srt/layers/attention/nsa/nsa_indexer_kpool.py"
SERVER_ARGS = "sglang/srt/server_args.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
MODEL_PY = "sglang/srt/models/glm5_next_dsa.py"
CONFIG_PY = "sglang/srt/configs/glm5_next.py"


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module", params=VERSIONS)
def wheel(request):
    return request.param, pypi.wheel("sglang-kt", request.param)


@pytest.fixture
def host(tmp_path, wheel):
    """An engine env's site-packages with the wheel's files, a model dir, a state dir."""
    version, whl = wheel
    env_dir = tmp_path / "envs" / f"{version}-test"
    prof = profile.build(
        "test", {"model_path": str(tmp_path / "model"), "install_root": str(tmp_path / "opt"), "engine_set": version}
    )
    site = Path(layout.site_packages(prof, str(env_dir)))
    pypi.extract(whl, [KPOOL, SERVER_ARGS, HTTP_SERVER, MODEL_PY, f"sglang_kt-{version}.dist-info/METADATA"], site)
    env = dict(os.environ, GLM_FLASH_STATE_DIR=str(tmp_path / "state"))
    return type(
        "Host",
        (),
        dict(version=version, prof=prof, env_dir=env_dir, site=site, env=env, tmp=tmp_path),
    )


def upload(h, prof=None, name="sets"):
    """The rendered set as a JSON file, as roles/engines/kt/patches.py uploads it."""
    d = h.tmp / name
    d.mkdir(exist_ok=True)
    pset = patch_sets.patch_set(prof or h.prof, str(h.env_dir), h.version)
    p = d / f"{pset['name']}.json"
    p.write_text(patch_sets.set_json(pset))
    return [p]


def tool(h, action, sets, *extra):
    return subprocess.run(
        [sys.executable, str(TOOL), action, *map(str, sets), *extra], env=h.env, capture_output=True, text=True
    )


def targets(h):
    files = [h.site / KPOOL, h.site / SERVER_ARGS, h.site / HTTP_SERVER]
    if h.version == "0.7.0.post1":
        files.append(h.site / MODEL_PY)
    return files


def forward_cuda_guard(source: str):
    """The `if` in forward_cuda that returns _forward_cuda_skip_logits, and forward_cuda."""
    tree = ast.parse(source)
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
        fwd = methods.get("forward_cuda")
        if fwd is None or "_should_use_triton_logits" not in methods:
            continue
        for node in ast.walk(fwd):
            if isinstance(node, ast.If) and any(
                isinstance(s, ast.Return)
                and isinstance(s.value, ast.Call)
                and getattr(s.value.func, "attr", "") == "_forward_cuda_skip_logits"
                for s in node.body
            ):
                return node, fwd
    raise AssertionError("no shortcut in forward_cuda")


def graph_sizes(source: str):
    """(cuda_graph_bs, cuda_graph_max_bs) assigned under `if not self.disable_cuda_graph:` in the GLM branch."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.UnaryOp)
            and getattr(node.test.operand, "attr", "") == "disable_cuda_graph"
        ):
            got = {
                a.targets[0].attr: ast.literal_eval(a.value)
                for a in node.body
                if isinstance(a, ast.Assign) and isinstance(a.targets[0], ast.Attribute)
            }
            if "cuda_graph_bs" in got:
                return got["cuda_graph_bs"], got["cuda_graph_max_bs"]
    raise AssertionError("no cuda_graph_bs assignment")


def post4_model_py(tmp: Path) -> str:
    return (pypi.extract(pypi.wheel("sglang-kt", "0.7.0.post4"), [MODEL_PY], tmp / "post4") / MODEL_PY).read_text()


def test_the_model_file_is_edited_only_where_the_engine_refuses_the_checkpoint(host):
    """post1 refuses the checkpoint's index sharing for MTP (its validator raises); post4 and 0.7.2
    accept it and turn it off for the base class. Only post1's set edits the model file, and the
    checkpoint is in no set."""
    pset = patch_sets.patch_set(host.prof, str(host.env_dir), host.version)
    assert pset["name"] == f"sglang-kt-{host.version}"
    assert pset["root"] == layout.site_packages(host.prof, str(host.env_dir))
    assert (MODEL_PY in [f["path"] for f in pset["files"]]) == (host.version == "0.7.0.post1")
    src = (host.site / MODEL_PY).read_text()
    refuses = 'raise ValueError("GLM-5-Next KPool does not support index sharing for MTP")' in src
    assert refuses == (host.version == "0.7.0.post1")
    assert ("base_config.index_share_for_mtp_iteration = False" in src) == (host.version != "0.7.0.post1")


def checkpoint_text_config(version: str, tmp: Path) -> SimpleNamespace:
    """The text config the engine builds from the checkpoint's config.json (sandbox/fake_model.py:
    the keys the public record names, index sharing for MTP true): Glm5NextTextConfig's own
    defaults from the wheel (configs/glm5_next.py), the checkpoint's values over them."""
    src = (pypi.extract(pypi.wheel("sglang-kt", version), [CONFIG_PY], tmp / "config") / CONFIG_PY).read_text()
    cls = next(n for n in ast.parse(src).body if isinstance(n, ast.ClassDef) and n.name == "Glm5NextTextConfig")
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    args = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    defaults = {}
    for arg, default in zip(args, init.args.defaults, strict=True):
        try:
            defaults[arg.arg] = ast.literal_eval(default)
        except ValueError:
            pass
    return SimpleNamespace(**{**defaults, **fake_model.TEXT_CONFIG})


def validate(source: str, config: SimpleNamespace) -> None:
    """The model file's own _validate_glm5_next_dsa_config, run on `config` (its isinstance check of
    the config class aside: the rest is the file's code as written)."""
    fn = next(
        n
        for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef) and n.name == "_validate_glm5_next_dsa_config"
    )
    code = compile(ast.Module(body=[fn], type_ignores=[]), MODEL_PY, "exec", flags=__future__.annotations.compiler_flag)
    scope = {"is_glm5_next_dsa_config": lambda c: True}
    exec(code, scope)
    scope["_validate_glm5_next_dsa_config"](config)


def test_the_engine_as_deployed_accepts_the_checkpoint_as_the_hub_sends_it(host):
    """The checkpoint's config.json says index_share_for_mtp_iteration: true. post1 as released
    refuses it when it builds the attention; with its set applied it accepts it, as post4 and
    0.7.2 do as released. The checkpoint is not touched."""
    config = checkpoint_text_config(host.version, host.tmp)
    assert config.index_share_for_mtp_iteration is True
    released = (host.site / MODEL_PY).read_text()
    if host.version == "0.7.0.post1":
        with pytest.raises(ValueError, match="does not support index sharing for MTP"):
            validate(released, config)
    else:
        validate(released, config)
    assert tool(host, "apply", upload(host)).returncode == 0
    validate((host.site / MODEL_PY).read_text(), config)
    # the validator still refuses what it is there for
    with pytest.raises(ValueError, match="index_topk_freq"):
        validate((host.site / MODEL_PY).read_text(), SimpleNamespace(**{**vars(config), "index_topk_freq": 2}))


def test_apply_then_noop_and_the_result_is_right(host):
    sets = upload(host)
    originals = {p: p.read_text() for p in targets(host)}
    r = tool(host, "check", sets)
    assert r.returncode == 1, r.stdout + r.stderr
    r = tool(host, "apply", sets)
    assert r.returncode == 0, r.stderr
    after = {p: sha(p) for p in targets(host)}
    assert all(after[p] != hashlib.sha256(originals[p].encode()).hexdigest() for p in after)

    # second run: nothing pending, nothing written
    mtimes = {p: p.stat().st_mtime_ns for p in targets(host)}
    assert tool(host, "check", sets).returncode == 0
    r = tool(host, "apply", sets)
    assert r.returncode == 0 and "patched " not in r.stdout
    assert {p: p.stat().st_mtime_ns for p in targets(host)} == mtimes

    # patched python still compiles
    for rel in (KPOOL, SERVER_ARGS):
        py_compile.compile(str(host.site / rel), cfile=str(host.tmp / "pyc"), doraise=True)

    # the shortcut is guarded by the class's own capability check, with forward_cuda's x
    guard, fwd = forward_cuda_guard((host.site / KPOOL).read_text())
    assert isinstance(guard.test, ast.BoolOp) and isinstance(guard.test.op, ast.And)
    first, second = guard.test.values
    assert ast.unparse(first) == "max_kv_len <= self.index_topk"
    assert isinstance(second, ast.UnaryOp) and isinstance(second.op, ast.Not)
    call = second.operand
    assert ast.unparse(call.func) == "self._should_use_triton_logits"
    assert [ast.unparse(a) for a in call.args] == [fwd.args.args[1].arg] == ["x"]
    # unpatched: the same if had no guard
    orig_guard, _ = forward_cuda_guard(originals[host.site / KPOOL])
    assert ast.unparse(orig_guard.test) == "max_kv_len <= self.index_topk"

    assert graph_sizes(originals[host.site / SERVER_ARGS]) == ([1, 2, 4], 4)
    assert graph_sizes((host.site / SERVER_ARGS).read_text()) == ([1, 2, 4, 8, 16, 24], 24)

    # post1's model file: as Python (comments aside), post4's own, which accepts the checkpoint's
    # index sharing for MTP and turns it off for the base class; unpatched, it was not
    if host.version == "0.7.0.post1":
        post4 = ast.dump(ast.parse(post4_model_py(host.tmp)))
        assert ast.dump(ast.parse(originals[host.site / MODEL_PY])) != post4
        assert ast.dump(ast.parse((host.site / MODEL_PY).read_text())) == post4
        py_compile.compile(str(host.site / MODEL_PY), cfile=str(host.tmp / "pyc"), doraise=True)

    # manifests: package, version, hashes of what is on disk
    m = json.loads((host.tmp / f"state/manifests/sglang-kt-{host.version}.json").read_text())
    assert (m["package"], m["version"]) == ("sglang-kt", host.version)
    for rel in (KPOOL, SERVER_ARGS):
        assert m["files"][str(host.site / rel)]["patched_sha256"] == after[host.site / rel]
        assert (
            m["files"][str(host.site / rel)]["original_sha256"]
            == hashlib.sha256(originals[host.site / rel].encode()).hexdigest()
        )


def test_profile_change_repatches_from_the_kept_original(host):
    assert tool(host, "apply", upload(host)).returncode == 0
    other = profile.build("test", {**host.prof.as_dict(), "cuda_graph_bs": [1, 2, 4, 8]})
    sets = upload(host, other, name="sets2")
    r = tool(host, "check", sets)
    assert r.returncode == 1 and "earlier edition" in r.stdout
    assert tool(host, "apply", sets).returncode == 0
    assert graph_sizes((host.site / SERVER_ARGS).read_text()) == ([1, 2, 4, 8], 8)
    assert tool(host, "check", sets).returncode == 0


@pytest.mark.parametrize("victim", ["kpool", "server_args", "metadata"])
def test_drifted_upstream_file_refuses_the_whole_run(host, victim):
    sets = upload(host)
    path, old, new = {
        "kpool": (host.site / KPOOL, "if max_kv_len <= self.index_topk:", "if max_kv_len < self.index_topk:"),
        "server_args": (
            host.site / SERVER_ARGS,
            "self.cuda_graph_bs = [1, 2, 4]\n            self.cuda_graph_max_bs = 4",
            "self.cuda_graph_bs = [1, 2, 4, 8]\n            self.cuda_graph_max_bs = 8",
        ),
        "metadata": (
            host.site / f"sglang_kt-{host.version}.dist-info/METADATA",
            f"Version: {host.version}",
            "Version: 0.7.9",
        ),
    }[victim]
    text = path.read_text()
    assert text.count(old) == 1
    path.write_text(text.replace(old, new))
    before = {p: sha(p) for p in targets(host)}
    r = tool(host, "apply", sets)
    assert r.returncode == 2
    msg = r.stderr
    assert f"sglang-kt {host.version}: {path}: patch sglang-kt-{host.version}:" in msg
    assert "Nothing was written" in msg and "Traceback" not in msg
    assert {p: sha(p) for p in targets(host)} == before
    assert not (host.tmp / "state").exists()


def test_a_version_without_a_patch_set_stops_clearly(host):
    with pytest.raises(patch_sets.PatchSetError, match=r"no engine patch set for sglang-kt 0\.7\.0\.post3"):
        patch_sets.patch_set(host.prof, str(host.env_dir), version="0.7.0.post3")
