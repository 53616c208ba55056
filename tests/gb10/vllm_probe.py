"""Run inside the vLLM 0.24.0 parser venv (tests/gb10/vllm_wheel.py), never in the control venv.

    python vllm_probe.py parse CASES_JSON       -> per argument list: {"ok": namespace} or {"error": msg}
    python vllm_probe.py serve ARGS_JSON FD     -> vLLM 0.24.0's own app (build_app: its API-key
                                                   middleware, every --middleware) with stand-in
                                                   engine routes, served by uvicorn

The parser is built as vllm/entrypoints/openai/api_server.py builds it (`make_arg_parser` on a
FlexibleArgumentParser, then `validate_parsed_serve_args`). vLLM picks its platform from the
hardware; this machine has no GPU, so the CPU platform is set before anything asks for it
(platform detection is the only step replaced; the flags are vLLM's own). `serve` builds the
app with vLLM's `build_app(args, ("generate",))`, which imports every --middleware by name and
adds it; the engine is not there (no GPU): stand-in routes, put first, echo what reached them.
"""

import json
import sys

import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def parse(argv):
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    return args


def main():
    cmd = sys.argv[1]
    if cmd == "parse":
        results = []
        for argv in json.loads(sys.argv[2]):
            try:
                results.append({"ok": vars(parse(argv))})
            except SystemExit as e:  # argparse's error exit
                results.append({"error": f"exit {e.code}"})
            except Exception as e:  # validate_parsed_serve_args
                results.append({"error": f"{type(e).__name__}: {e}"})
        print(json.dumps(results, default=lambda o: o.__dict__ if hasattr(o, "__dict__") else repr(o)))
        return
    argv, fd = json.loads(sys.argv[2]), int(sys.argv[3])
    args = parse(argv)
    # The server's own argv, as glm-flash-launch leaves it for `python -m <module>` (its --api-key
    # added in-process): the thinking-budget middleware reads the server's keys from there.
    sys.argv = ["vllm.entrypoints.openai.api_server", *argv]
    import uvicorn
    from fastapi import Request
    from fastapi.routing import APIRoute
    from vllm.entrypoints.openai.api_server import build_app

    app = build_app(args, ("generate",))

    async def echo(request: Request):
        raw = await request.body()
        return {
            "path": request.url.path,
            "content_length": request.headers.get("content-length"),
            "received": json.loads(raw) if raw else None,
        }

    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages"):
        app.router.routes.insert(0, APIRoute(path, echo, methods=["POST"]))
    # argv[3]: the fd of a socket the test bound to 127.0.0.1:0 and listens on (passed down, so no
    # port is closed by the test and then reused here). No lifespan: it would wait for the engine.
    uvicorn.run(app, fd=fd, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
