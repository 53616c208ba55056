"""sandbox/vllm-0.24.0-parser.json is vLLM 0.24.0's own serve parser, option for option.

The GB10 sandbox's flag check parses the deploy's flags with a replica built from that dump
(sandbox/gb10_python.py): the machine's torch is a stand-in, so vLLM's parser module cannot import
there. The dump ships in the repository so `sandbox/gb10.py up` needs no flag; this test rebuilds it
from the real parser (PyPI's wheel in the cached CPU-torch venv, tests/gb10/vllm_wheel.py) and fails
when they differ. `python tests/gb10/test_parser_dump.py` writes it anew.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from vllm_wheel import parser_python

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "sandbox" / "vllm-0.24.0-parser.json"
DUMP = """
import json, vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = make_arg_parser(FlexibleArgumentParser())
acts = [{"opts": a.option_strings, "dest": a.dest, "nargs": a.nargs,
         "choices": [str(c) for c in a.choices] if a.choices else None}
        for a in p._actions if a.option_strings and a.dest != "help"]
print(json.dumps({"vllm": vllm.__version__, "actions": acts}, indent=0, sort_keys=True))
"""


def real_dump() -> dict:
    out = subprocess.run([str(parser_python()), "-c", DUMP], capture_output=True, text=True, check=True)
    return json.loads(out.stdout[out.stdout.index("{") :])


def test_the_shipped_dump_is_the_real_parsers():
    shipped = json.loads(SHIPPED.read_text())
    real = real_dump()
    assert shipped["vllm"] == real["vllm"] == "0.24.0"
    assert shipped["actions"] == real["actions"]
    assert any("--speculative-config" in a["opts"] for a in shipped["actions"])


if __name__ == "__main__":
    SHIPPED.write_text(json.dumps(real_dump(), indent=0, sort_keys=True) + "\n")
