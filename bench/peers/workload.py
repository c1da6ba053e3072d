"""The workload every system runs, written once so that the three scripted models cannot drift apart.

One turn = K tool-calling iterations + a final answer. The user prompt names K (``"k=3"``); at each model call
the scripted model counts the tool results it has seen in this turn: fewer than K, it calls the ``lookup`` tool
once more; K, it answers :func:`final_answer`. The tool is replay-safe, runs as an activity and returns a short
string. Each system checks the final answer, so a turn that skipped a tool call fails instead of looking fast.

Only the standard library here: every system's subprocess imports this module.
"""

from __future__ import annotations

import re

TOOL_NAME = "lookup"
TOOL_DESCRIPTION = "Look something up."
INSTRUCTIONS = "Call the lookup tool as many times as the user asks, then answer."

_K = re.compile(r"\bk=(\d+)\b")


def prompt(k: int) -> str:
    """The user message of a K-iteration turn."""
    return f"k={k}"


def parse_k(text: str) -> int:
    """K from the user message (:func:`prompt`)."""
    found = _K.search(text)
    if found is None:
        raise ValueError(f"no k=<n> in the prompt {text!r}")
    return int(found.group(1))


def tool_query(done: int) -> str:
    """The argument of the ``done``-th lookup (0-based)."""
    return f"q{done}"


def lookup_result(q: str) -> str:
    """What the tool returns: a short string."""
    return f"result for {q}"


def final_answer(k: int) -> str:
    """The model's last answer after K tool results."""
    return f"done after {k} lookups"


def check(k: int, output: object) -> None:
    """Raise unless ``output`` is the final answer of a K-iteration turn."""
    if output != final_answer(k):
        raise RuntimeError(f"K={k} turn ended with {output!r}, expected {final_answer(k)!r}")
