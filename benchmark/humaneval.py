"""HumanEval and HumanEval+: what the model is asked, what is taken from its answer, what runs.

The ask: the problem's prompt (a signature and docstring) in a ```python block, with the
instruction to answer with the complete function in one ```python block (`ask`).

The code taken from the answer (`extract`): the first fenced code block that defines the
problem's function (`def <entry_point>(`); else the first fenced block; else, when the answer
has no fence, the whole answer. Reasoning is never searched: not `reasoning_content`, and not a
`<think>...</think>` span left in the content by a server without a reasoning parser. An answer
cut off inside an unclosed fence keeps what came after the opening fence.

What runs (`program`): the problem's prompt, then the extracted code, then the dataset's
`check` function called on the entry point. The prompt comes first so its imports and helper
functions exist (HumanEval/38's encode_cyclic, for one); a completion that defines the whole
function replaces the prompt's stub, one that continues the body completes it.

HumanEval+ (`plus_program`): evalplus's differential test, written from its documented
behaviour (docs/sources.md §19): every input of `base_input` + `plus_input` goes to the
canonical solution and to the candidate (each on its own deep copy); outputs must be equal,
or, where the task has an `atol` or the expected value is a float (or a list of floats; then
atol 1e-6), close within it (relative 1e-7). HumanEval/32 (find_zero) passes when the
polynomial at the candidate's root is within atol of zero.
"""

from __future__ import annotations

import json
import re

THINK = re.compile(r"<think>.*?(</think>|\Z)", re.DOTALL)
FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)

INSTRUCTION = (
    "Complete the following Python function. Answer with the complete function, including the "
    "signature and any imports it needs, in one ```python code block."
)


def ask(problem: dict) -> str:
    return f"{INSTRUCTION}\n\n```python\n{problem['prompt'].rstrip()}\n```"


def extract(answer: str, entry_point: str) -> str:
    answer = THINK.sub("", answer or "").strip()
    blocks = [m.group(2) for m in FENCE.finditer(answer)]
    if not blocks:
        return answer
    defines = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)
    return next((b for b in blocks if defines.search(b)), blocks[0])


def program(problem: dict, code: str) -> str:
    return f"{problem['prompt']}\n{code}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


PLUS_HARNESS = r'''
import copy as _copy
import json as _json
import math as _math

_task = _json.loads({task!r})
_canonical_ns = {{}}
exec(_task["prompt"] + _task["canonical_solution"], _canonical_ns)
_canonical = _canonical_ns[_task["entry_point"]]
_candidate = {entry_point}


def _floats(x):
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and len(x) > 0 and all(isinstance(i, float) for i in x)


def _close(out, exp, atol):
    if isinstance(exp, (list, tuple)):
        return isinstance(out, (list, tuple)) and len(out) == len(exp) and all(
            _close(o, e, atol) for o, e in zip(out, exp))
    if isinstance(out, bool) or isinstance(exp, bool) or not isinstance(out, (int, float)):
        return out == exp
    return _math.isclose(out, exp, rel_tol=1e-7, abs_tol=atol)


def _poly(xs, x):
    return sum(c * _math.pow(x, i) for i, c in enumerate(xs))


for _n, _inp in enumerate(_task["base_input"] + _task["plus_input"]):
    _atol = _task.get("atol") or 0
    _exp = _canonical(*_copy.deepcopy(_inp))
    _out = _candidate(*_copy.deepcopy(_inp))
    if _task["entry_point"] == "find_zero":
        _ok = abs(_poly(_inp[0], _out)) <= max(_atol, 1e-6)
    else:
        if _atol == 0 and _floats(_exp):
            _atol = 1e-6
        _ok = _out == _exp or (_atol != 0 and _close(_out, _exp, _atol))
    if not _ok:
        raise AssertionError(f"input {{_n}}: got {{_out!r:.200}}, expected {{_exp!r:.200}}")
'''


def plus_program(task: dict, code: str) -> str:
    keep = {k: task[k] for k in ("prompt", "canonical_solution", "entry_point", "base_input", "plus_input")}
    keep["atol"] = task.get("atol") or 0
    harness = PLUS_HARNESS.format(task=json.dumps(keep), entry_point=task["entry_point"])
    return f"{task['prompt']}\n{code}\n{harness}"
