"""Application callbacks (the authorization hook, ``on_event``) called without blocking the worker's event loop.

A synchronous callback runs in a thread of a small pool of its own; an ``async def`` callback (or one that returns an
awaitable) is awaited on the loop. Inside an activity that heartbeats, the heartbeat goes on while the callback runs,
so a slow approval service or a slow observer never makes a live worker look dead. Inside an activity, a callback
gets at most what is left of the attempt's start-to-close time (less a margin for the write that follows): past
that, it raises ``TimeoutError`` (the thread is left to finish on its own) instead of the attempt timing out and
being retried, which would ask again and again. Callbacks are never called inside a store transaction (which would
hold row locks, and on SQLite the database-wide lock, for as long as they take).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from temporalio import activity

from turnkit._temporal.heartbeats import heartbeating
from turnkit.store.store import in_transaction

__all__ = ["call_application", "callbacks_within", "require_no_transaction"]

#: A deadline nearer than the activity attempt's own for the callbacks of one call: a tool call's hook questions share
#: the tool's own timeout with its body, while the attempt's start-to-close also covers the store phases around them.
_call_deadline: Final[contextvars.ContextVar[datetime | None]] = contextvars.ContextVar(
    "turnkit_callback_deadline", default=None
)

#: Threads for synchronous callbacks: separate from asyncio's default executor, so slow hooks cannot starve it.
_POOL: Final = ThreadPoolExecutor(max_workers=16, thread_name_prefix="turnkit-callback")


async def call_application(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call an application callback off the event loop (sync) or on it (async) and return its result.

    Raises:
        RuntimeError: Called inside a store transaction (a TurnKit bug: callbacks run between transactions).
        Exception: Whatever the callback raised.
    """
    require_no_transaction()
    return await asyncio.wait_for(_call(fn, *args, **kwargs), _time_left())


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    async with heartbeating():  # when due, inside an activity: a slow hook must not look like a dead worker
        if _is_async(fn):
            result = fn(*args, **kwargs)
        else:
            loop = asyncio.get_running_loop()
            call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
            result = await loop.run_in_executor(_POOL, call)
        if inspect.isawaitable(result):
            result = await result
        return result


def _time_left() -> float | None:
    """Seconds a callback may take inside this activity attempt (None: unbounded, outside activities)."""
    if not activity.in_activity():
        return None
    info = activity.info()
    deadlines: list[datetime] = []
    if info.start_to_close_timeout:
        deadlines.append(info.started_time + info.start_to_close_timeout)
    if info.schedule_to_close_timeout:
        deadlines.append(info.scheduled_time + info.schedule_to_close_timeout)
    call_deadline = _call_deadline.get()
    if call_deadline is not None:
        deadlines.append(call_deadline)
    if not deadlines:
        return None
    margin = min(5.0, 0.2 * (min(deadlines) - info.started_time).total_seconds())
    return max((min(deadlines) - datetime.now(UTC)).total_seconds() - margin, 0.1)


@contextmanager
def callbacks_within(seconds: float | None) -> Generator[None]:
    """Callbacks called in the block answer within ``seconds`` of the activity attempt's start (None: the attempt's
    own time), e.g. a tool call's hook questions within the tool's own timeout."""
    if seconds is None or not activity.in_activity():
        yield
        return
    token = _call_deadline.set(activity.info().started_time + timedelta(seconds=seconds))
    try:
        yield
    finally:
        _call_deadline.reset(token)


def require_no_transaction() -> None:
    """Raise RuntimeError inside a store transaction: callbacks run between transactions (a TurnKit bug if not)."""
    if in_transaction():
        raise RuntimeError("application callbacks must not run inside a store transaction")


def _is_async(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object whose __call__ is ``async def``
    return call is not None and inspect.iscoroutinefunction(call)
