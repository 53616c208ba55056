"""Run inside the vLLM 0.33.0 parser venv (tests/gb10/vllm_wheel.py), never in the control venv.

    python vllm_probe.py parse CASES_JSON       -> per argument list: {"ok": namespace} or {"error": msg}
    python vllm_probe.py serve ARGS_JSON FD     -> vLLM's own middleware wiring on a FastAPI app
                                                   with a stand-in engine route, served by uvicorn

`serve` builds the app as vLLM 0.33.0 does for its middleware: init_entrypoints_middleware()
with the parsed args, which imports every --middleware by name and adds it. The engine is
not there (no GPU): the stand-in routes echo what reached them, as JSON.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402
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
    args = parse(json.loads(sys.argv[2]))
    import uvicorn
    from fastapi import FastAPI, Request
    from vllm.entrypoints.serve.middleware.register import init_entrypoints_middleware

    app = FastAPI()

    async def echo(request: Request):
        raw = await request.body()
        return {
            "path": request.url.path,
            "content_length": request.headers.get("content-length"),
            "received": json.loads(raw) if raw else None,
        }

    for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages"):
        app.post(path)(echo)
    init_entrypoints_middleware(args, app, ("generate",))
    # argv[3]: the fd of a socket the test bound to 127.0.0.1:0 and listens on (passed down, so no
    # port is closed by the test and then reused here).
    uvicorn.run(app, fd=int(sys.argv[3]), log_level="warning")


if __name__ == "__main__":
    main()
