"""Run inside the vLLM 0.33.0 parser venv (tests/gb10/vllm_wheel.py), never in the control venv.

    python vllm_log_probe.py ARGS_JSON   -> what vLLM's API server logs while it sets up, on stdout/stderr

The same steps as vllm.entrypoints.launchers.api_server.entry.main() up to the engine:
parse with vLLM's serve parser, configure vLLM's logging from the args, validate, then
setup_server(), which logs the version and the non-default args and binds the socket.
The engine is not started (no GPU).
"""

import json
import os
import sys

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402
from vllm.entrypoints.launchers.launcher import setup_server  # noqa: E402
from vllm.logger import configure_logging_from_args  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def main():
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    args = parser.parse_args(json.loads(sys.argv[1]))
    configure_logging_from_args(args)
    validate_parsed_serve_args(args)
    _, sock = setup_server(args, reuse_port=False)
    sock.close()


if __name__ == "__main__":
    main()
