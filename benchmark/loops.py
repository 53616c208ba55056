"""Loop probe: long code generations checked for degenerate repetition.

The rule (`degenerate`): an answer is degenerate when somewhere in it one block of 1 to
`MAX_PERIOD` (400) characters is repeated back to back at least `MIN_REPEATS` (10) times in
all, and that run covers at least `MIN_SPAN` (800) characters. A model stuck in a loop repeats
a line or a paragraph until the length cap, thousands of characters; legitimate code repeats
short things (indentation, a `# ====` rule, a few similar asserts) that stay far below 800
characters of exact repetition. Reasoning is checked the same way, separately: a model can
loop while thinking and never answer. Not caught: loops whose repeats differ (a counter that
increments); the answer's finish reason (`length`, cut at max_tokens) is reported beside.

The search is one regular expression with a greedy block: at each position it tries the
longest block first, so a run of a long period is not cut into runs of a short one. The run is
then measured at the block's own period (its shortest repeating unit), to the last character
that still repeats, so a greedy block twice the period does not shorten it.
"""

from __future__ import annotations

import re

MAX_PERIOD = 400
MIN_REPEATS = 10
MIN_SPAN = 800
_RUN = re.compile(rf"(.{{1,{MAX_PERIOD}}})\1{{{MIN_REPEATS - 1},}}", re.DOTALL)

# Long code asks, one per sample (the probe asks the first N; they differ so no two share a prefix).
TOPICS = (
    "an LRU cache with a size limit and time-to-live per entry",
    "a tokenizer and recursive-descent parser for arithmetic expressions with variables",
    "a priority task scheduler with dependencies and cycle detection",
    "an in-memory key-value store with transactions (begin, commit, rollback)",
    "a Markdown-to-HTML converter for headings, lists, emphasis and code blocks",
    "a rate limiter (token bucket and sliding window) for many clients",
    "a JSON schema validator for objects, arrays, strings, numbers and enums",
    "a text-adventure game engine with rooms, items and a command parser",
    "a matrix class with addition, multiplication, transpose, determinant and inverse",
    "a bank account ledger with transfers, interest and an audit log",
    "a graph library with BFS, DFS, Dijkstra and topological sort",
    "a CSV reader and writer that handles quoting, escapes and headers",
    "an event bus with subscriptions, wildcards and priorities",
    "a simple regular-expression matcher supporting . * + ? and character classes",
    "an inventory system for a warehouse with restocking rules and reports",
    "a command-line todo manager persisting tasks to a JSON file",
)


def ask(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return (
        f"Write a complete, long Python module implementing {topic}, with type hints, docstrings, "
        "error handling and a full pytest test suite at the end. Output only code in one ```python block."
    )


def period(block: str) -> int:
    """Length of the shortest unit `block` is a repetition of."""
    n = len(block)
    return next(d for d in range(1, n + 1) if n % d == 0 and block[:d] * (n // d) == block)


def longest_run(text: str) -> tuple[int, str]:
    """(characters covered, the repeated unit) of the longest qualifying run; (0, '') if none."""
    text = text or ""
    best, unit, pos = 0, "", 0
    while True:
        m = _RUN.search(text, pos)
        if not m:
            return best, unit
        p = period(m.group(1))
        end = m.end()
        while end < len(text) and text[end] == text[end - p]:
            end += 1
        if end - m.start() > best:
            best, unit = end - m.start(), m.group(1)[:p]
        pos = end


def degenerate(text: str) -> bool:
    return longest_run(text)[0] >= MIN_SPAN
