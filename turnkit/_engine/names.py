"""The rule for names and keys the application gives TurnKit (agent, model and subject names, skill keys, delivery
and steering keys), in a module light enough for agent and skill definitions to import (no store, no settings).

A name is a non-empty ``str`` that fits its column and holds only printable characters: no NUL or lone surrogate
(the store could not hold them alike on every backend) and no control character or bidirectional override. A name is
printed by the operator's tools and shown in prompts and the Temporal UI, where a control character would be obeyed
(an escape sequence) or would hide what the name really is. :mod:`turnkit._engine.validation` re-exports it.
"""

from __future__ import annotations

import re
from typing import Any, Final

from turnkit.kernel.errors import InputError
from turnkit.store.storable import UNSTORABLE_CHARS

__all__ = ["MAX_NAME_CHARS", "char_problem", "check_name", "short_string"]

#: Agent and model names: the ``String(255)`` columns they are stored in (``turnkit.store.schema``; a test holds the
#: two equal). PostgreSQL enforces the length and SQLite does not: checking here gives both the same rule.
MAX_NAME_CHARS: Final = 255

#: C0 controls (tab and newline too), DEL, C1 controls, and the bidirectional embeddings, overrides and isolates.
_CONTROL_CHARS: Final = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def char_problem(value: str) -> str | None:
    """What makes ``value`` unstorable (a NUL, a lone surrogate), or None."""
    found = UNSTORABLE_CHARS.search(value)
    if found is None:
        return None
    return "must not contain NUL characters" if found.group() == "\x00" else "is not valid UTF-8 (a lone surrogate)"


def short_string(field: str, value: Any, limit: int) -> str:
    """A non-empty ``str`` of at most ``limit`` storable characters (names and keys).

    Raises:
        InputError: naming ``field`` and what is wrong with it.
    """
    if not isinstance(value, str) or not value:
        raise InputError(f"{field} must be a non-empty string")
    if len(value) > limit:
        raise InputError(f"{field} is too long: {len(value)} characters (at most {limit})")
    problem = char_problem(value)
    if problem is not None:
        raise InputError(f"{field} {problem}")
    return value


def check_name(field: str, value: Any, *, optional: bool = True) -> str | None:
    """An agent, model or subject name, or a skill key: a non-empty ``str`` of at most :data:`MAX_NAME_CHARS`
    storable characters, none of them a control character.

    Raises:
        InputError: ``"<field> must not contain control characters"``, or what else is wrong with it.
    """
    if value is None and optional:
        return None
    name = short_string(field, value, MAX_NAME_CHARS)
    if _CONTROL_CHARS.search(name) is not None:
        raise InputError(f"{field} must not contain control characters")
    return name
