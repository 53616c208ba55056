"""The GB10 sandbox's stand-in python3.12: the sitecustomize of a real CPython 3.12 copied into the
machine (sandbox/gb10.py), so it runs in that interpreter and in every venv made from it.

Why a stand-in: DGX OS ships python3.12 and the box is aarch64 with CUDA 13; the engine
environment installs locks/vllm/0.24.0-aarch64.txt (aarch64 wheels, hash-locked: nothing an
x86_64 machine can install) and its torch imports only with CUDA. Here, in the three places
the deploy meets that, this interpreter answers as the box would, from real files where there
are any; everything else is plain CPython 3.12:

1. `python -m pip install ... --require-hashes -r <env>.vllm.txt` (files/glm-flash-vllm-build):
   the same flags, but the sandbox's wheelhouse instead of PyPI and the lock: the real vLLM
   0.24.0 x86_64 wheel from PyPI (the same Python files as the aarch64 one; its compiled parts do
   not matter here) and a stand-in torch 2.11.0 (a version record, CUDA 13.0) in its place,
   both hash-checked (--require-hashes stays on).
2. the build's last step, `import torch, vllm; ... moe_w2_cubit`: vLLM's import needs CUDA torch,
   so this checks instead that the fork's module the import names is installed and compiles,
   and prints the versions the installed metadata records.
3. files/glm-flash-check-flags: vLLM's parser module imports torch, so the parser comes from a
   replica of vLLM 0.24.0's own serve parser (every option, its nargs and choices, dumped from
   the real parser: sandbox/vllm-0.24.0-parser.json). The rest of the tool is real: the fork's
   VLLM_* settings are looked up in the installed (patched) files, the record is written.
4. `python -c 'import vllm ...'` elsewhere (the host checks read the versions): `vllm` is a
   stand-in module carrying the installed version and path.
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


def _pip(argv: list[str]) -> None:
    """sys.argv is ['-m', 'install', ...] here; rewrite it in place (runpy keeps argv[1:])."""
    if "install" not in argv or "--require-hashes" not in argv or "-r" not in argv:
        return
    at = argv.index("-r")
    if not argv[at + 1].endswith(".vllm.txt"):
        return
    out, skip = [], False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--index-url":
            out += ["--no-index", "--find-links", f"{STANDIN}/wheelhouse"]
            skip = True
        elif i == at + 1:
            out.append(f"{STANDIN}/wheelhouse/requirements.txt")
        else:
            out.append(a)
    _note(f"installing the sandbox's wheelhouse instead of {argv[at + 1]} (aarch64 wheels)")
    argv[:] = out


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
    import torch  # the stand-in torch of the wheelhouse

    _note("vLLM's import needs CUDA torch: checked that the patched files compile instead")
    print(json.dumps({"vllm": version("vllm"), "torch": version("torch"), "torch_cuda": torch.version.cuda}))
    sys.stdout.flush()
    os._exit(0)


def _version_only() -> None:
    """`python -c 'import vllm, torch; print(vllm.__version__, ...)'` (the host checks): vLLM's
    package import needs CUDA torch, so `vllm` is a stand-in module with the installed version
    (from its metadata) and the installed package's path; torch is the wheelhouse's record."""
    import types
    from importlib.metadata import version

    mod = types.ModuleType("vllm")
    mod.__version__ = version("vllm")
    mod.__path__ = [os.path.join(_purelib(), "vllm")]
    sys.modules["vllm"] = mod
    _note("vLLM's import needs CUDA torch: `vllm` answers its installed version only")


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
    if len(cmd) > 2 and cmd[1:3] == ["-m", "pip"]:
        _pip(sys.argv)
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
