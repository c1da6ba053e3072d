"""When the Temporal server is away (a restart, a lost connection, overload), and repeating a call through it.

The SDK's client reconnects by itself; an idempotent call made meanwhile fails with one of :data:`SERVER_AWAY` and
may simply be made again (issue 8 item 6).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from temporalio.service import RPCError, RPCStatusCode

__all__ = ["SERVER_AWAY", "while_server_away"]

T = TypeVar("T")

#: RPC statuses that mean the Temporal server is away or overloaded, not that the call was refused.
SERVER_AWAY: Final = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.CANCELLED,
        RPCStatusCode.UNKNOWN,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.ABORTED,
        RPCStatusCode.INTERNAL,
    }
)


async def while_server_away(
    call: Callable[[], Awaitable[T]], *, window: float, retry_if: Callable[[RPCError], bool] | None = None
) -> T:
    """``call()``, repeated while it fails because the server is away (or ``retry_if`` says so), for up to ``window``
    seconds; any other :class:`RPCError`, or one that outlasts the window, is raised."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + window
    delay = 0.1
    while True:
        try:
            return await call()
        except RPCError as err:
            retryable = err.status in SERVER_AWAY or (retry_if is not None and retry_if(err))
            if not retryable or loop.time() >= give_up:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
