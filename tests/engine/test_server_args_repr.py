"""The API key stays out of the `server_args=ServerArgs(...)` line sglang-kt logs at start.

Against the real sglang-kt wheels from PyPI (0.7.0.post1, post4, 0.7.2; cached, see
test_engine_patch_sets.py): the sets are rendered as a deploy uploads them and applied by
the real files/glm-flash-patch. The engine cannot be imported here (torch, CUDA), so the
dataclass is rebuilt from the patched file's own ServerArgs field definitions (their source
text, evaluated) around a canary key; the sandbox test (tests/sandbox/test_unit_secrets.py)
imports the real class in the deployed engine environment.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from typing import Any, Optional

import pypi
from test_engine_patch_sets import HTTP_SERVER, SERVER_ARGS, host, tool, upload, wheel  # noqa: F401  (fixtures)

CANARY = "sk-canary-3f9a1c"
KEY_FIELDS = ("api_key", "admin_api_key")
ENGINE_PY = "sglang/srt/entrypoints/engine.py"


def key_fields(source: str) -> dict[str, ast.AnnAssign]:
    """The api_key/admin_api_key field definitions of class ServerArgs."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    return {
        n.target.id: n
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id in KEY_FIELDS
    }


def rebuilt_repr(source: str) -> str:
    """repr of a dataclass made of the file's key fields (their source, evaluated) plus one plain field."""
    fields = key_fields(source)
    assert set(fields) == set(KEY_FIELDS)
    body = "\n".join(f"    {ast.unparse(n)}" for n in fields.values())
    code = f"@dataclasses.dataclass\nclass ServerArgs:\n    served_model_name: Optional[str] = None\n{body}\n"
    scope = {"dataclasses": dataclasses, "Optional": Optional}
    exec(code, scope)
    cls = scope["ServerArgs"]
    assert cls.api_key is None and cls.admin_api_key is None, "the parser's defaults (ServerArgs.api_key) changed"
    return repr(cls(served_model_name="glm", api_key=CANARY, admin_api_key=CANARY))


def test_the_engine_logs_server_args_at_start(host):  # noqa: F811
    """Why the edit exists: the start log line, in the real wheel."""
    src = pypi.extract(pypi.wheel("sglang-kt", host.version), [ENGINE_PY], host.tmp / "e") / ENGINE_PY
    assert 'logger.info(f"{server_args=}")' in src.read_text()


def test_patched_server_args_repr_lacks_the_key(host):  # noqa: F811
    path = host.site / SERVER_ARGS
    original = path.read_text()
    assert CANARY in rebuilt_repr(original), "unpatched, the key is in the repr (else this test proves nothing)"
    r = tool(host, "apply", upload(host))
    assert r.returncode == 0, r.stdout + r.stderr
    patched = path.read_text()
    shown = rebuilt_repr(patched)
    assert CANARY not in shown and "served_model_name='glm'" in shown
    # the field lines are replaced, nothing else of the class's fields
    assert [ast.unparse(n) for n in key_fields(patched).values()] == [
        f"{name}: Optional[str] = dataclasses.field(default=None, repr=False)" for name in KEY_FIELDS
    ]


def test_a_changed_key_field_upstream_refuses_the_run(host):  # noqa: F811
    path = host.site / SERVER_ARGS
    text = path.read_text()
    old = "    api_key: Optional[str] = None\n"
    assert text.count(old) == 1
    path.write_text(text.replace(old, "    api_key: Optional[str] = ''\n"))
    before = path.read_text()
    r = tool(host, "apply", upload(host))
    assert r.returncode == 2 and "api-keys-not-in-repr" in r.stderr and "Nothing was written" in r.stderr, r.stderr
    assert path.read_text() == before


def server_info_answer(source: str) -> dict:
    """What the file's `/server_info` handler answers, run on a ServerArgs holding the canary key
    (the handler's own source, without its route decorator; the tokenizer manager a stand-in)."""
    fn = next(n for n in ast.parse(source).body if isinstance(n, ast.AsyncFunctionDef) and n.name == "server_info")
    fn.decorator_list = []

    @dataclasses.dataclass
    class ServerArgs:
        served_model_name: str | None = None
        api_key: str | None = dataclasses.field(default=None, repr=False)
        admin_api_key: str | None = dataclasses.field(default=None, repr=False)

    class Manager:
        server_args = ServerArgs(served_model_name="glm", api_key=CANARY, admin_api_key=CANARY)

        async def get_internal_state(self):
            return [{}]

    state = type("State", (), {"tokenizer_manager": Manager(), "scheduler_info": {"max_req_input_len": 1}})
    scope = {
        "dataclasses": dataclasses,
        "List": list,
        "Dict": dict,
        "Any": Any,
        "_global_state": state,
        "__version__": "x",
    }
    exec(compile(ast.Module([fn], []), "server_info", "exec"), scope)
    return asyncio.run(scope["server_info"]())


def test_server_info_answers_without_the_keys(host):  # noqa: F811
    """/get_server_info (and /server_info) answer key holders with dataclasses.asdict(server_args):
    repr=False does not keep the key out of that."""
    path = host.site / HTTP_SERVER
    before = server_info_answer(path.read_text())
    assert before["api_key"] == CANARY, "unpatched, the key is in the answer (else this test proves nothing)"
    r = tool(host, "apply", upload(host))
    assert r.returncode == 0, r.stdout + r.stderr
    after = server_info_answer(path.read_text())
    assert CANARY not in repr(after) and not set(KEY_FIELDS) & set(after)
    assert {k: v for k, v in before.items() if k not in KEY_FIELDS} == after
