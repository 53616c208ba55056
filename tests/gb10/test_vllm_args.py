"""The GB10 launch flags (roles/engines/vllm/launch.py) against vLLM 0.24.0's own serve parser (the
release the vLLM-Moet fork patches), and the thinking-budget default through vLLM's own app
over real HTTP.

vLLM runs from the real 0.24.0 wheel in a cached venv (tests/gb10/vllm_wheel.py: CPU torch,
vLLM --no-deps, a frozen pure-Python closure). Simulated: the GPU (vLLM's CPU platform is set
instead of detected) and the engine itself: the HTTP test's chat/completion routes are
stand-ins, put before vLLM's, that echo what reached them. Everything in front of the engine is
vLLM's and ours: `build_app` (FastAPI, its API-key middleware, every `--middleware` imported by
name), uvicorn, and files/glm_flash_defaults.py. The fork's patch edits nothing under
vllm/entrypoints or vllm/engine, but it does edit vllm/config/speculative.py, config/vllm.py and
envs.py (docs/sources.md §20): the deploy parses the flags again with the patched engine on the
host, and checks there that the patched engine reads each fork setting of the unit's environment
(files/glm-flash-check-flags, tests/gb10/test_check_flags_vllm.py).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from vllm_wheel import parser_python

from control.profile import build
from roles.engines.vllm import launch as vllm_launch

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PROBE = HERE / "vllm_probe.py"
GB10 = {"platform": "gb10", "vllm_ref": "0123456789abcdef0123456789abcdef01234567", "accept_drafter_license": True}


@pytest.fixture(scope="module")
def vpy() -> str:
    return str(parser_python())


@pytest.fixture(scope="module")
def profile():
    return build("gx10.example.lan", GB10, api_key_present=False)


BAD = [
    ["--mamba-cache-mode", "sometimes"],
    ["--max-num-seqs", "one"],
    ["--no-such-flag-glm"],
    ["--enable-auto-tool-choice", "--tool-call-parser", ""],
]


@pytest.fixture(scope="module")
def parsed(vpy, profile):
    """vLLM's parser on: our flags; our flags + the launcher's API key flag; our flags + each BAD."""
    args = vllm_launch.vllm_args(profile)
    spec = vllm_launch.launch_spec(profile)
    cases = [args, spec["args"] + [spec["api_key_flag"], "k-123"]] + [args + bad for bad in BAD]
    r = subprocess.run(
        [vpy, str(PROBE), "parse", json.dumps(cases)], capture_output=True, text=True, timeout=600, cwd=HERE
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_flags_parse_with_vllm_0_24_and_mean_what_the_report_says(parsed):
    assert "ok" in parsed[0], parsed[0]
    a = parsed[0]["ok"]
    assert a["model"] == "/srv/models/GLM-5.3-Flash"
    assert a["served_model_name"] == ["glm-5.3-flash"]
    assert (a["host"], a["port"]) == ("127.0.0.1", 8000)
    assert a["tensor_parallel_size"] == 1
    assert a["max_model_len"] == 204800
    assert a["max_num_seqs"] == 1
    assert a["gpu_memory_utilization"] == 0.9
    assert a["safetensors_load_strategy"] == "lazy"
    assert a["enable_prefix_caching"] is True
    assert a["mamba_cache_mode"] == "align"
    assert a["speculative_config"] == {
        "method": "dflash",
        "model": "/srv/models/GLM-5.3-Flash-DFlash2",
        "num_speculative_tokens": 7,
    }
    assert a["default_chat_template_kwargs"] == {"reasoning_effort": "low"}
    assert a["reasoning_parser"] == "glm45"
    assert (a["tool_call_parser"], a["enable_auto_tool_choice"]) == ("glm47", True)
    assert a["middleware"] == ["glm_flash_defaults.ThinkingBudgetDefault"]
    assert a["api_key"] is None  # the key is added in-process by glm-flash-launch


def test_the_launchers_api_key_flag_exists(parsed):
    assert parsed[1]["ok"]["api_key"] == ["k-123"]


@pytest.mark.parametrize("i", range(len(BAD)))
def test_the_parser_refuses_what_vllm_does_not_know(parsed, i):
    assert "error" in parsed[2 + i], (BAD[i], parsed[2 + i])


@pytest.fixture(scope="module")
def server(vpy, profile):
    """vLLM's middleware stack on uvicorn at 127.0.0.1, with the unit's environment."""
    # The listening socket is handed to the server (its fd): the port is never closed and reused.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    argv = vllm_launch.vllm_args(profile) + ["--api-key", "test-key"]
    env = dict(os.environ, PYTHONPATH=str(REPO / "files"), **vllm_launch.vllm_env(profile))
    proc = subprocess.Popen(
        [vpy, str(PROBE), "serve", json.dumps(argv), str(listener.fileno())],
        pass_fds=(listener.fileno(),),
        cwd=HERE,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    listener.close()  # the server has its own copy
    # The socket listens from the start, so a connection alone proves nothing: wait for an HTTP answer.
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail("server exited: " + proc.stdout.read()[-3000:])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/")
            conn.getresponse().read()
            break
        except OSError:
            time.sleep(0.5)
        finally:
            conn.close()
    else:
        proc.kill()
        pytest.fail("server did not answer HTTP within 180 s")
    yield port
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def post(port, path, body, key="test-key", chunked=False):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    if chunked:
        conn.request("POST", path, body=iter([data[:7], data[7:]]), headers=headers, encode_chunked=True)
    else:
        conn.request("POST", path, body=data, headers=headers)
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, (json.loads(raw) if raw else None)


CHAT = {"model": "glm-5.3-flash", "messages": [{"role": "user", "content": "Schreib ein Gedicht über Zürich"}]}


def test_a_request_without_a_budget_gets_the_default(server):
    status, echo = post(server, "/v1/chat/completions", CHAT)
    assert status == 200
    assert echo["received"]["thinking_token_budget"] == 1536
    assert echo["received"]["messages"] == CHAT["messages"]  # the rest is untouched (non-ASCII too)
    assert int(echo["content_length"]) == len(
        json.dumps(echo["received"], ensure_ascii=False, separators=(",", ":")).encode()
    )


def test_a_request_with_its_own_budget_keeps_it(server):
    status, echo = post(server, "/v1/chat/completions", dict(CHAT, thinking_token_budget=300))
    assert status == 200 and echo["received"]["thinking_token_budget"] == 300


def test_null_budget_and_legacy_completions_and_chunked_bodies_get_the_default(server):
    assert (
        post(server, "/v1/chat/completions", dict(CHAT, thinking_token_budget=None))[1]["received"][
            "thinking_token_budget"
        ]
        == 1536
    )
    assert (
        post(server, "/v1/completions", {"model": "glm-5.3-flash", "prompt": "hi"})[1]["received"][
            "thinking_token_budget"
        ]
        == 1536
    )
    status, echo = post(server, "/v1/chat/completions", CHAT, chunked=True)
    assert status == 200 and echo["received"]["thinking_token_budget"] == 1536


def test_other_routes_and_other_bodies_pass_through(server):
    # Anthropic's API carries its own budget field (thinking.budget_tokens): not ours to change
    assert "thinking_token_budget" not in post(server, "/v1/messages", CHAT)[1]["received"]
    status, echo = post(server, "/v1/chat/completions", [1, 2])
    assert status == 200 and echo["received"] == [1, 2]


def test_the_api_key_is_still_required(server):
    status, _ = post(server, "/v1/chat/completions", CHAT, key=None)
    assert status == 401
    status, _ = post(server, "/v1/chat/completions", CHAT, key="wrong")
    assert status == 401
