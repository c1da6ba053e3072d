"""Keep an activity's heartbeat going while it awaits something slow (a model, a tool, a store that is away).

A heartbeat is a call to the Temporal server that updates the activity's state there (the SDK sends the first at
once and throttles the rest). Blocks that end before a heartbeat is due need none: the heartbeat timeout runs from
the attempt's start or its last heartbeat. So beats are paced per activity, from when its attempt began
(:class:`HeartbeatClock` notes it) or from its last beat, not from the start of each block. Before, every block beat
at its start: about one heartbeat call per activity of a turn, ~2.5 per one-iteration turn, each a write to the
workflow's state on the server, for store phases that take milliseconds.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager, suppress
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

__all__ = ["HeartbeatClock", "heartbeating", "note_attempt_start"]

#: When the running activity last heartbeat (event-loop time), or began; a one-item list shared by its blocks.
_last_beat: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("turnkit_last_beat", default=None)


class HeartbeatClock(Interceptor):
    """Notes when each activity attempt begins, so :func:`heartbeating` beats only when a beat is due (registered by
    :class:`~turnkit.plugin.TurnKitPlugin` on every worker)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Clocked(next)


class _Clocked(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        note_attempt_start()  # the activity's own context: its blocks share it
        return await super().execute_activity(input)


def note_attempt_start() -> None:
    """Note, in the current context, that an activity attempt begins now: what :class:`HeartbeatClock` does for each
    attempt a worker runs (for code that runs an activity without a worker's interceptors, as a benchmark does)."""
    _last_beat.set([asyncio.get_running_loop().time()])


@asynccontextmanager
async def heartbeating() -> AsyncGenerator[None, None]:
    """Heartbeat every half heartbeat timeout until the block ends, so a live worker is never declared dead.

    The first beat comes half a timeout after the attempt began or last beat (at once when that is unknown: a worker
    without :class:`HeartbeatClock`). A dead worker stops heartbeating, which is how Temporal notices it (the
    heartbeat timeout fires); a cancellation reaches the activity with the answer to a beat.
    """
    timeout = activity.info().heartbeat_timeout if activity.in_activity() else None
    if not timeout:  # no heartbeat timeout, or a direct call outside an activity (a test)
        yield
        return
    interval = max(timeout.total_seconds() / 2, 0.05)
    loop = asyncio.get_running_loop()
    last = _last_beat.get()

    async def beat() -> None:
        while True:
            activity.heartbeat()
            if last is not None:
                last[0] = loop.time()
            await asyncio.sleep(interval)

    # Most blocks end before a beat is due (a store phase takes milliseconds; the interval is seconds): a timer that
    # starts the beating task only when due costs a handle, where a task per block cost its creation, its first
    # sleep and its cancellation.
    task: asyncio.Task[None] | None = None

    def start() -> None:
        nonlocal task
        task = loop.create_task(beat())

    due = 0.0 if last is None else max(0.0, last[0] + interval - loop.time())
    timer = loop.call_later(due, start)
    try:
        yield
    finally:
        timer.cancel()
        if task is not None:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task
