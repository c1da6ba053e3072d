"""A worker interceptor that makes deterministic store failures non-retryable in every activity (issue 8 items 1, 11).

Store activities retry under ``STORE_RETRY`` for as long as the database is away. A write the database *rejects*
(a NUL, a too-long string, NaN in JSON) would be rejected by every retry as well, so retrying wedges the turn or the
lane forever. In one place for all activities, this interceptor re-raises such a failure as a non-retryable
``ApplicationError`` of type ``TurnKit::StoreError`` with a short message: no SQL text and no parameter values reach
the workflow's failure or a stored error. Transient failures (connection lost, deadlock, database locked) stay
retryable; the SQLAlchemy ones are re-raised under a short message too (type ``TurnKit::StoreUnavailable``).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from turnkit.store.errors import (
    STORE_ERROR_TYPE,
    STORE_UNAVAILABLE_TYPE,
    deterministic_store_error,
    sql_error,
    store_failure_message,
    unavailable_message,
)

__all__ = ["StoreFailureInterceptor"]


class StoreFailureInterceptor(Interceptor):
    """Registered by :class:`~turnkit.plugin.TurnKitPlugin` on every worker."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _StoreFailureInbound(next)


class _StoreFailureInbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except ApplicationError:
            raise
        except Exception as err:
            # Only TurnKit's own activities (store phases and tool calls): an application's activities registered on
            # the same worker keep their own retry semantics.
            if not _turnkit_activity():
                raise
            if deterministic_store_error(err):
                message = store_failure_message(err)
                activity.logger.warning("store failure, not retried: %s (%s)", message, type(err).__name__)
                # `from None`: the original exception's text holds the SQL and its parameters; it must not travel.
                raise ApplicationError(message, type=STORE_ERROR_TYPE, non_retryable=True) from None
            if sql_error(err):
                # Transient: retried as before, but under a short message, so that an attempt that is recorded
                # (the last one, an interrupted tool call) carries no SQL either.
                raise ApplicationError(unavailable_message(err), type=STORE_UNAVAILABLE_TYPE) from None
            raise


def _turnkit_activity() -> bool:
    """Whether the running activity is TurnKit's (``turnkit.*`` store phases, ``tool:*`` tool calls)."""
    return activity.info().activity_type.startswith(("turnkit.", "tool:"))
