"""Model clients a caller lends to the activity of its own request (``Turn.paint(..., client=…)``).

A client object lives in a process; it cannot cross Temporal. The caller lends it under its request's key for as long
as it waits for the request, and the activity borrows it when it runs in the same process (a worker in the
application's process: scripts, tests, the demo). A worker in another process, or one that runs the call after the
caller has gone, does not have it: the call then fails with ``ConfigError`` rather than use another client. An
agent's own client (``Agent(client=…)``) is known to every worker that registers the agent, and has no such limit.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager

from turnkit.kernel.errors import ConfigError
from turnkit.model import Client

__all__ = ["borrow", "lend"]

_lent: dict[str, Client] = {}


@contextmanager
def lend(key: str, client: Client | None) -> Generator[None]:
    """Lend ``client`` (if any) under ``key`` inside the block."""
    if client is None:
        yield
        return
    _lent[key] = client
    try:
        yield
    finally:
        if _lent.get(key) is client:
            del _lent[key]


def borrow(key: str) -> Client:
    """The client lent under ``key`` in this process.

    Raises:
        ConfigError: None is lent here (the worker runs in another process, or the caller has gone).
    """
    client = _lent.get(key)
    if client is None:
        raise ConfigError(
            "the client= given to this call lives in the caller's process, and this worker is not in it: give the "
            "agent the client (Agent(client=…)), or run the worker in the caller's process"
        )
    return client
