"""The eval's pure parts: code extraction, the loop rule, McNemar's exact test."""

from __future__ import annotations

from math import comb

import pytest

from benchmark import compare, humaneval, loops


def test_extraction_takes_the_block_that_defines_the_function():
    answer = "First a helper:\n```python\nimport math\n```\nNow:\n```python\ndef f(x):\n    return x\n```\nBye"
    assert humaneval.extract(answer, "f") == "def f(x):\n    return x\n"
    assert humaneval.extract("```\nx = 1\n```", "f") == "x = 1\n"  # no block defines f: the first one
    assert humaneval.extract("def f(x):\n    return 2", "f") == "def f(x):\n    return 2"  # no fence: all
    assert humaneval.extract("```python\ndef f(x):\n    return 3", "f") == "def f(x):\n    return 3"  # cut off
    assert humaneval.extract("```python\ndef fx(x): pass\n```\n```py\ndef f(): pass\n```", "f") == "def f(): pass\n"
    thinking = (
        "<think>maybe\n```python\ndef f(x):\n    return 0\n```\n</think>\n```python\ndef f(x):\n    return 1\n```"
    )
    assert humaneval.extract(thinking, "f") == "def f(x):\n    return 1\n"


def test_loop_rule_at_its_thresholds():
    block = "    result = compute(value)\n" * 1  # 28 characters
    assert loops.degenerate("x = 1\n" + block * 29) is True  # 29 x 28 = 812 >= 800
    assert loops.degenerate("x = 1\n" + block * 28) is False  # 784 < 800
    long = "def handler_7():\n    return process(payload, retries=3, timeout=30)\n"  # 68 characters
    assert len(long) == 68
    assert loops.degenerate(long * 11) is False  # 748 characters
    assert loops.degenerate(long * 12) is True  # 816 characters in 12 repeats
    assert loops.longest_run(long * 12) == (816, long)
    wide = "x" * 90 + "\n"  # 91 characters: 9 repeats cover 819 but are fewer than 10
    assert loops.degenerate(wide * 9) is False and loops.degenerate(wide * 10) is True


def test_loop_rule_passes_ordinary_code():
    code = (
        "# "
        + "=" * 78
        + "\n"
        + "".join(
            f"def test_case_{i}():\n    assert cache.get({i}) is None\n    cache.put({i}, {i * i})\n" for i in range(60)
        )
        + "    " * 30
        + "\n"
        + "assert cache.size() == 0\n" * 6
    )
    assert len(code) > 4000 and loops.degenerate(code) is False
    # the same loop seen with a short block inside it (spaces, "aaaa") is still found at its own period
    assert loops.degenerate(("a" * 10 + "b" * 10 + "\n") * 60) is True


def test_mcnemar_exact_by_hand():
    # 4 items only a passed, 2 only b: p = 2 * (C(6,0) + C(6,1) + C(6,2)) / 2^6 = 44/64
    assert compare.mcnemar_exact(4, 2) == pytest.approx(44 / 64)
    assert compare.mcnemar_exact(2, 4) == pytest.approx(44 / 64)
    assert compare.mcnemar_exact(0, 0) == 1.0
    assert compare.mcnemar_exact(3, 3) == 1.0  # symmetric: capped at 1
    assert compare.mcnemar_exact(10, 0) == pytest.approx(2 / 1024)
    assert compare.mcnemar_exact(9, 1) == pytest.approx(2 * (1 + 10) / 1024)
    assert compare.mcnemar_exact(5, 8) == pytest.approx(2 * sum(comb(13, k) for k in range(6)) / 2**13)


def test_paired_counts():
    a = {"t1": True, "t2": True, "t3": False, "t4": False, "t5": True}
    b = {"t1": True, "t2": False, "t3": True, "t4": False, "t9": True}
    c = compare.paired(a, b)
    assert (c["items"], c["both_pass"], c["both_fail"], c["a_only"], c["b_only"]) == (4, 1, 1, ["t2"], ["t3"])
    assert c["agreement"] == 0.5 and c["mcnemar_p"] == 1.0
