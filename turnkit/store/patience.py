"""Client-side store calls that wait out a database blink (issue 8): a restart or failover of the database must not
surface as a raw driver error from ``ask``, ``Turn.result()`` or ``Turn.refresh()``.

Only transient errors (connection refused or lost, the server shutting down) are retried, with a backoff, for up
to ``window`` seconds; then, or at once for any other driver error, the caller gets a short ``StoreError`` (never
the SQL text and its values). TurnKit's own errors (``RecordNotFound``...) pass through untouched.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import turnkit.kernel.errors as errors
from turnkit.store.errors import (
    deterministic_store_error,
    store_failure_message,
    transient_store_error,
    unavailable_message,
)

__all__ = ["BLINK_WINDOW", "patiently"]

#: How long a client-side store call waits out a database that is away before it raises ``StoreError`` (the same
#: bound as the lane's submit, ``SUBMIT_TIMEOUT``).
BLINK_WINDOW = 60.0

T = TypeVar("T")


async def patiently(call: Callable[[], Awaitable[T]], *, what: str, window: float | None = None) -> T:
    """Run ``call`` (idempotent), retrying it while the store is away for up to ``window`` s (``BLINK_WINDOW``).

    ``what`` completes the error message: "the store did not <what>: <why>".
    """
    loop = asyncio.get_running_loop()
    give_up = loop.time() + (BLINK_WINDOW if window is None else window)
    delay = 0.2
    while True:
        try:
            return await call()
        except errors.Error:
            raise
        except Exception as err:
            if transient_store_error(err) and loop.time() + delay < give_up:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            why = store_failure_message(err) if deterministic_store_error(err) else unavailable_message(err)
            raise errors.StoreError(f"the store did not {what}: {why}") from err
