"""Ride out a store outage inside an activity: retry a transaction while the database is away, heartbeating.

Used for the store phases of the activities Temporal must not simply retry: the model activity (an attempt spent
on a database blink would be a paid model call lost, and five of them fail the turn) and the tool activity (an
at-most-once tool whose body ran must have its result recorded, never be run again). Each retried operation is one
whole transaction and idempotent, so running it again after a failure whose commit may have landed is safe.

The wait is bounded by the activity itself: its start-to-close timeout, and the turn's deadline, which cancels
the activity (the cancellation arrives through the heartbeats sent here).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from turnkit._temporal.heartbeats import heartbeating
from turnkit.kernel.metrics import activity_meter, store_retried
from turnkit.store.errors import transient_store_error

__all__ = ["retry_store"]

T = TypeVar("T")

logger = logging.getLogger("turnkit.store")

INITIAL_DELAY = 0.2
MAXIMUM_DELAY = 5.0


async def retry_store(operation: Callable[[], Awaitable[T]], *, what: str) -> T:
    """Run ``operation`` (one idempotent transaction) until it succeeds or fails for a non-transient reason.

    While the store is away the activity keeps heartbeating, so Temporal sees a live worker (and can cancel it).
    """
    delay = INITIAL_DELAY
    failures = 0
    first_failure = 0.0
    outcome = "gave_up"  # unless it succeeds: a non-transient error, or the attempt cancelled or timed out
    try:
        async with heartbeating():
            while True:
                try:
                    result = await operation()
                except Exception as err:
                    if not transient_store_error(err):
                        raise
                    failures += 1
                    if failures == 1:
                        first_failure = time.monotonic()
                    if failures == 1 or failures % 10 == 0:
                        logger.warning("store unavailable during %s (attempt %d), retrying: %s", what, failures, err)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAXIMUM_DELAY)
                    continue
                if failures:
                    logger.info("store back for %s after %d failed attempts", what, failures)
                outcome = "succeeded"
                return result
    finally:
        if failures:  # metrics: each failed try once, and the time the activity spent waiting out the store
            _retried(what, failures, first_failure, outcome)


def _retried(what: str, failures: int, since: float, outcome: str) -> None:
    """Record a wait for the store: ``failures`` tries failed since ``since`` (monotonic), then ``outcome``."""
    store_retried(
        activity_meter(), operation=what, failures=failures, seconds=time.monotonic() - since, outcome=outcome
    )
