"""The TurnKit connection of the enclosing ``async with turnkit.connect()``: what ``Agent.run`` and its siblings use.

A module of its own so that agent definitions (``turnkit.agent``) need not import the runtime that connects them.
"""

from __future__ import annotations

import contextvars
from collections.abc import Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from turnkit.kernel.errors import ConfigError

if TYPE_CHECKING:
    from turnkit.runtime import TurnKit

__all__ = ["current", "current_connection"]

_current: contextvars.ContextVar[TurnKit | None] = contextvars.ContextVar("turnkit_current", default=None)


def current() -> TurnKit:
    """The TurnKit connection of the enclosing ``async with turnkit.connect()`` (what ``Agent.run`` uses)."""
    tk = _current.get()
    if tk is None:
        raise ConfigError("no TurnKit connection: use `async with turnkit.connect() as tk` (or tk.run(agent, ...))")
    return tk


@contextmanager
def current_connection(tk: TurnKit) -> Generator[TurnKit]:
    """Make ``tk`` the current connection inside the block (``connect()`` does; so may a test)."""
    token = _current.set(tk)
    try:
        yield tk
    finally:
        _current.reset(token)
