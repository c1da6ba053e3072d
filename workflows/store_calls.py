"""How the workflows call the store: one definition of the retry settings and of the call itself, for the lane and
the turn.

Store writes are quick and idempotent, so they are safe to retry for as long as the database is away; a write the
database rejects fails at once instead (``TurnKit::StoreError`` is non-retryable, see ``activities/store_failures``).

A store call is first a *local* activity: it runs in the worker that runs the workflow task, inside that task, so it
costs no activity task on the server and no second workflow task for its completion. On the dev server each of those
waits for the history service's rate-limited transfer queue (~50 ms), and a submitted turn reaches its model call two
workflow-task round trips sooner. Nothing is lost by it: the store call needs no task queue of its own (every
workflow worker has the store) and is idempotent (a workflow task retried after a crash runs it again and finds what
it wrote).

Only the fast path is local: one attempt. A store call whose attempt fails runs again as a regular activity with the
full retry policy, because a local activity is the wrong tool for an outage: it keeps the workflow task open
(heartbeating it adds three events every 8 s), and the SDK (temporalio 1.35) does not end its retries at
``schedule_to_close_timeout`` (measured: a local activity bounded at 5 s that always fails retries for minutes),
which would break the 60 s bound of a submission. On the server the bound holds and an outage costs no history.
A non-retryable failure takes the same way, so callers see it as the activity's ``ActivityError``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError

__all__ = ["LOCAL_ATTEMPT_TIMEOUT", "LOCAL_RETRY", "STORE_RETRY", "STORE_TIMEOUT", "local_failure", "store_call"]

_ArgT = TypeVar("_ArgT")
_ResultT = TypeVar("_ResultT")

STORE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10))
STORE_TIMEOUT = timedelta(seconds=30)
#: The local fast path is one attempt, bounded; a failed one runs again as a regular activity. One, because the SDK's
#: retries of a local activity leave the earlier attempt's start-to-close timer running (temporalio 1.35; sdk-rust
#: #1454): it can time out a later attempt early, and it panics a core thread when it fires after the worker stopped.
LOCAL_RETRY = RetryPolicy(maximum_attempts=1)
LOCAL_ATTEMPT_TIMEOUT = timedelta(seconds=10)


def local_failure(err: Exception) -> BaseException | None:
    """What failed a local activity: the SDK raises the attempt's failure itself, and an ``ActivityError`` (whose
    cause it is) only for a timeout."""
    return err.cause if isinstance(err, ActivityError) else err


async def store_call(
    declared: Callable[[Any, _ArgT], Awaitable[_ResultT]],
    arg: _ArgT,
    *,
    summary: str,
    schedule_to_close: timedelta | None = None,
) -> _ResultT:
    """Run the declared store activity ``declared`` (a method of :mod:`turnkit.kernel.activities`): one local attempt,
    then as a regular activity with the store's retries.

    ``schedule_to_close`` bounds the regular attempts together (None: retry for as long as the store is away).
    """
    try:
        return await workflow.execute_local_activity_method(
            declared,
            arg,
            start_to_close_timeout=LOCAL_ATTEMPT_TIMEOUT,
            retry_policy=LOCAL_RETRY,
            summary=summary,
        )
    except Exception as err:
        # Whatever it was, the regular activity below runs the call again. Not a cancellation: its workflow is
        # being cancelled.
        if isinstance(local_failure(err), CancelledError):
            raise
    return await workflow.execute_activity_method(
        declared,
        arg,
        start_to_close_timeout=STORE_TIMEOUT,
        schedule_to_close_timeout=schedule_to_close,
        retry_policy=STORE_RETRY,
        summary=summary,
    )
