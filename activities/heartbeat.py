"""Keep an activity's heartbeat going while it awaits something slow (a model, a tool)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager, suppress

from temporalio import activity

__all__ = ["heartbeating"]


@asynccontextmanager
async def heartbeating() -> AsyncGenerator[None, None]:
    """Heartbeat at half the heartbeat timeout until the block ends, so a live worker is never declared dead.

    A dead worker stops heartbeating, which is how Temporal notices it (the heartbeat timeout fires).
    """
    timeout = activity.info().heartbeat_timeout if activity.in_activity() else None
    if not timeout:  # no heartbeat timeout, or a direct call outside an activity (a test)
        yield
        return
    interval = max(timeout.total_seconds() / 2, 0.05)

    async def beat() -> None:
        while True:
            activity.heartbeat()
            await asyncio.sleep(interval)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task
