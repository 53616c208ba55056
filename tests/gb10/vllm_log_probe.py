"""Run inside the vLLM 0.24.0 parser venv (tests/gb10/vllm_wheel.py), never in the control venv.

    python vllm_log_probe.py ARG...   -> what vLLM's API server logs while it sets up, on stdout/stderr

The same steps as vllm/entrypoints/openai/api_server.py's `__main__` up to the engine: parse
with vLLM's serve parser, validate, then `setup_server(args)`, which logs the version and the
non-default args and binds the socket. The engine is not started (no GPU), and the CPU platform
is set because this machine has none (tests/gb10/vllm_probe.py). Takes its arguments as the
engine does, so files/glm-flash-launch can run it as the spec's module.
"""

import sys

import vllm.platforms
from vllm.platforms.cpu import CpuPlatform

vllm.platforms._current_platform = CpuPlatform()

from vllm.entrypoints.openai.api_server import setup_server  # noqa: E402
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402


def main():
    parser = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))
    args = parser.parse_args(sys.argv[1:])
    validate_parsed_serve_args(args)
    _, sock = setup_server(args)
    sock.close()


if __name__ == "__main__":
    main()
