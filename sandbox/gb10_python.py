"""The GB10 sandbox's stand-in python3.12: the sitecustomize of a real CPython 3.12 copied into the
machine (sandbox/gb10.py), so it runs in that interpreter and in every venv made from it.

Why a stand-in: DGX OS ships python3.12 and the box is aarch64 with CUDA 13; the engine
environment installs locks/vllm/0.24.0-aarch64.txt (aarch64 wheels, hash-locked) and its torch
imports only with CUDA on an aarch64 CPU. Here, in the places the deploy meets that, this
interpreter answers as the box's would; everything else is plain CPython 3.12:

1. uv's query of the interpreter (`python -I -B -c '... get_interpreter_info ...'`, by
   files/glm-flash-vllm-build's `uv venv` and `uv pip install`): the machine is aarch64
   (platform.machine, sysconfig.get_platform), so uv installs the lock as on the box: PyPI's real
   aarch64 wheels, every file's sha256 checked (--require-hashes). They are never executed here.
2. the build's last step, `import torch, vllm; ... moe_w2_cubit`: vLLM's import needs CUDA torch on
   aarch64, so this checks instead that the fork's module the import names is installed and
   compiles, and prints the versions the installed files record (torch/version.py of the wheel).
3. files/glm-flash-check-flags: vLLM's parser module imports torch, so the parser comes from a
   replica of vLLM 0.24.0's own serve parser (every option, its nargs and choices, dumped from
   the real parser: sandbox/vllm-0.24.0-parser.json). The rest of the tool is real: the fork's
   VLLM_* settings are looked up in the installed (patched) files, the record is written.
4. `python -c 'import vllm, torch ...'` elsewhere (the host checks read the versions): `vllm` and
   `torch` are stand-in modules carrying the installed versions (and torch's CUDA) and paths.
Each answer says "stand-in" on stderr. Nothing here runs anywhere but in the GB10 sandbox.
"""

import os
import sys

STANDIN = "/srv/glm-flash-standin"


def _cmdline() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def _note(msg: str) -> None:
    print(f"gb10-sandbox stand-in python3.12: {msg}", file=sys.stderr, flush=True)


def _purelib() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def _aarch64() -> None:
    """uv's interpreter query: answer as the box's python3.12 (aarch64; glibc and the rest are this machine's)."""
    import platform
    import sysconfig

    platform.machine = lambda: "aarch64"
    sysconfig.get_platform = lambda: "linux-aarch64"
    _note("uv asks which machine this is: aarch64 (the box's)")


def _torch_version() -> tuple[str, str | None]:
    """(__version__, cuda) from the installed torch's version.py (pure Python; torch itself is aarch64)."""
    namespace: dict = {}
    with open(os.path.join(_purelib(), "torch", "version.py")) as f:
        exec(compile(f.read(), "torch/version.py", "exec"), namespace)
    return namespace["__version__"], namespace.get("cuda")


def _smoke(code: str) -> None:
    import json
    from importlib.metadata import version

    rel = "vllm/model_executor/layers/quantization/utils/moe_w2_cubit.py"
    path = os.path.join(_purelib(), rel)
    with open(path) as f:
        compile(f.read(), path, "exec")
    for name in ("vllm/v1/core/sched/scheduler.py", "vllm/envs.py"):
        with open(os.path.join(_purelib(), name)) as f:
            compile(f.read(), name, "exec")
    torch, cuda = _torch_version()
    _note("vLLM's import needs CUDA torch on aarch64: checked that the patched files compile instead")
    print(json.dumps({"vllm": version("vllm"), "torch": torch, "torch_cuda": cuda}))
    sys.stdout.flush()
    os._exit(0)


def _version_only() -> None:
    """`python -c 'import vllm, torch; print(vllm.__version__, torch.version.cuda)'` (the host checks):
    both imports need CUDA torch on aarch64, so `vllm` and `torch` are stand-in modules with the
    installed versions (vLLM's from its metadata, torch's and its CUDA from its version.py) and the
    installed packages' paths."""
    import types
    from importlib.metadata import version

    mod = types.ModuleType("vllm")
    mod.__version__ = version("vllm")
    mod.__path__ = [os.path.join(_purelib(), "vllm")]
    torch, cuda = _torch_version()
    tmod = types.ModuleType("torch")
    tmod.__version__, tmod.version = torch, types.SimpleNamespace(__version__=torch, cuda=cuda)
    tmod.__path__ = [os.path.join(_purelib(), "torch")]
    sys.modules["vllm"], sys.modules["torch"] = mod, tmod
    _note("vLLM's and torch's imports need CUDA torch on aarch64: they answer their installed versions only")


def _parser() -> None:
    import argparse
    import json
    import types

    with open(f"{STANDIN}/vllm-0.24.0-parser.json") as f:
        dump = json.load(f)

    class FlexibleArgumentParser(argparse.ArgumentParser):
        """Replica: vLLM's parser also takes --a_b for --a-b."""

        def parse_known_args(self, args=None, namespace=None):
            fixed = []
            for a in args or []:
                if a.startswith("--"):
                    name, eq, value = a.partition("=")
                    a = name.replace("_", "-") + eq + value
                fixed.append(a)
            return super().parse_known_args(fixed, namespace)

    def make_arg_parser(parser):
        for action in dump["actions"]:
            kw = {"dest": action["dest"]}
            if action["nargs"] == 0:
                kw["action"] = "store_true"
            else:
                if action["nargs"] is not None:
                    kw["nargs"] = action["nargs"]
                if action["choices"]:
                    kw["choices"] = action["choices"]
            parser.add_argument(*action["opts"], **kw)
        return parser

    for name in ("vllm", "vllm.entrypoints", "vllm.entrypoints.openai", "vllm.utils"):
        mod = types.ModuleType(name)
        mod.__path__ = []
        sys.modules[name] = mod
    cli = types.ModuleType("vllm.entrypoints.openai.cli_args")
    cli.make_arg_parser = make_arg_parser
    utils = types.ModuleType("vllm.utils.argparse_utils")
    utils.FlexibleArgumentParser = FlexibleArgumentParser
    sys.modules[cli.__name__], sys.modules[utils.__name__] = cli, utils
    _note(
        f"vLLM's parser imports torch: the replica of vLLM {dump['vllm']}'s serve parser ({len(dump['actions'])} options)"
    )


def _main() -> None:
    if not os.path.isdir(STANDIN):
        return
    cmd = _cmdline()
    if len(cmd) > 4 and cmd[1:4] == ["-I", "-B", "-c"] and "get_interpreter_info" in cmd[4]:
        _aarch64()
    elif len(cmd) > 2 and cmd[1] == "-c" and "moe_w2_cubit" in cmd[2]:
        try:
            _smoke(cmd[2])
        except Exception as e:  # what the real import would have failed on
            _note(f"the build's import check failed: {type(e).__name__}: {e}")
            os._exit(1)
    elif len(cmd) > 1 and cmd[1].endswith("/glm-flash-check-flags"):
        _parser()
    elif len(cmd) > 2 and cmd[1] == "-c" and "import vllm" in cmd[2]:
        _version_only()


_main()
