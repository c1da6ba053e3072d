"""The workflows behind the client's requests (docs/design.md, "No side doors"): one short workflow per request.

* ``CancelWorkflow`` (``Turn.cancel``): ``turnkit.cancel_turns`` authorises and ends the turn (and its descendants,
  cascading) in one transaction; ``turnkit.announce_cancel`` then cancels their workflows and tells their callbacks,
  waiters and lanes. Both are store calls: one local attempt, then retried as regular activities until done.
* ``CompactionWorkflow`` (``Conversation.compact``): ``turnkit.compact``, the summariser's call and the summary's
  append, retried like a model call.
* ``StandaloneMediaWorkflow`` (``Turn.paint`` / ``Turn.view_media`` of a prepared turn; workflow id = turn id):
  ``turnkit.standalone_media`` claims the turn under this run's token, calls the client and ends the turn; when its
  attempts run out, ``turnkit.end_standalone`` records the turn ``failed``. A cancel of the turn cancels this workflow
  (its id is the turn's), and with it the call in flight.

A client that dies after starting one of these leaves the whole request to the workflow; one that dies before started
nothing. A TurnKit error that no retry mends fails the workflow with that error's class, which the client raises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

from turnkit._workflows.store_calls import LOCAL_ATTEMPT_TIMEOUT, LOCAL_RETRY, STORE_RETRY, STORE_TIMEOUT, local_failure
from turnkit.kernel.activities import RequestCalls
from turnkit.kernel.failures import MODEL_NON_RETRYABLE, failure_of
from turnkit.kernel.names import CANCEL_WORKFLOW, COMPACTION_WORKFLOW, STANDALONE_MEDIA_WORKFLOW
from turnkit.kernel.payloads import ModelPolicy
from turnkit.kernel.requests import (
    CancelPlan,
    CancelRequest,
    CompactRequest,
    StandaloneEnd,
    StandaloneMedia,
    StandaloneOutcome,
)

__all__ = ["COMPACTION_ERROR", "CancelWorkflow", "CompactionWorkflow", "StandaloneMediaWorkflow"]

_ArgT = TypeVar("_ArgT")
_ResultT = TypeVar("_ResultT")

#: The failure type of a manual compaction that failed (``turnkit.CompactionError``).
COMPACTION_ERROR = "TurnKit::CompactionError"


@workflow.defn(name=CANCEL_WORKFLOW)
class CancelWorkflow:
    """One ``Turn.cancel``: the store's writes, then what follows them, each step retried until done."""

    @workflow.run
    async def run(self, request: CancelRequest) -> CancelPlan:
        plan = await _store_step(RequestCalls.cancel_turns, request, summary=f"cancel · {request.turn_id}")
        if plan.turn_ids:
            await _store_step(RequestCalls.announce_cancel, plan, summary=f"announce · {len(plan.turn_ids)} turns")
        return plan


@workflow.defn(name=COMPACTION_WORKFLOW)
class CompactionWorkflow:
    """One ``Conversation.compact``: the summary's id when it is appended."""

    @workflow.run
    async def run(self, request: CompactRequest) -> str:
        try:
            return await workflow.execute_activity_method(
                RequestCalls.compact,
                request,
                **_model_call(request.policy),
                summary=f"compact · {request.conversation_id}",
            )
        except ActivityError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.non_retryable:
                raise _final(cause) from err
            # The attempts ran out (a provider that stayed away, a call that timed out).
            _, message = failure_of(cause, err)
            raise ApplicationError(f"compaction failed: {message}", type=COMPACTION_ERROR, non_retryable=True) from err


@workflow.defn(name=STANDALONE_MEDIA_WORKFLOW)
class StandaloneMediaWorkflow:
    """One standalone ``paint`` / ``view_media`` of a prepared turn: how it left the turn (the record has the rest)."""

    @workflow.run
    async def run(self, request: StandaloneMedia) -> StandaloneOutcome:
        # One claim token per run: a retried attempt finds the claim its predecessor took, and resumes under it.
        claimed = request.model_copy(update={"claim_token": workflow.uuid4().hex})
        try:
            return await workflow.execute_activity_method(
                RequestCalls.standalone_media,
                claimed,
                **_model_call(request.policy),
                summary=f"{request.operation} · {request.turn_id}",
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise asyncio.CancelledError() from err  # the turn was cancelled: its record says so already
            error_class, message = failure_of(err.cause, err)
            end = StandaloneEnd(turn_id=request.turn_id, error_class=error_class, error_message=message)
            return await _store_step(RequestCalls.end_standalone, end, summary=f"fail · {request.turn_id}")


def _model_call(policy: ModelPolicy) -> dict[str, Any]:
    """A paid call's schedule, as the turn's model call has it: its timeouts and attempts, errors a retry cannot
    mend not retried."""
    return {
        "start_to_close_timeout": timedelta(seconds=policy.timeout),
        "heartbeat_timeout": timedelta(seconds=policy.heartbeat),
        "retry_policy": RetryPolicy(
            initial_interval=timedelta(seconds=1),
            maximum_interval=timedelta(seconds=30),
            maximum_attempts=policy.max_attempts,
            non_retryable_error_types=list(MODEL_NON_RETRYABLE),
        ),
    }


async def _store_step(declared: Callable[[Any, _ArgT], Awaitable[_ResultT]], arg: _ArgT, *, summary: str) -> _ResultT:
    """A store step: one local attempt, then a regular activity retried for as long as the store is away
    (``store_call``'s way), except that a failure no retry mends is final at once: the authorization hook is not
    asked twice for one denial."""
    try:
        return await workflow.execute_local_activity_method(
            declared, arg, start_to_close_timeout=LOCAL_ATTEMPT_TIMEOUT, retry_policy=LOCAL_RETRY, summary=summary
        )
    except Exception as err:
        failure = local_failure(err)
        if isinstance(failure, CancelledError):
            raise
        if isinstance(failure, ApplicationError) and failure.non_retryable:
            raise _final(failure) from err
    try:
        return await workflow.execute_activity_method(
            declared, arg, start_to_close_timeout=STORE_TIMEOUT, retry_policy=STORE_RETRY, summary=summary
        )
    except ActivityError as err:
        if isinstance(err.cause, ApplicationError) and err.cause.non_retryable:
            raise _final(err.cause) from err
        raise


def _final(cause: ApplicationError) -> ApplicationError:
    """The workflow's failure for an activity's final one: the same TurnKit error class and message."""
    name = cause.type or "Error"
    return ApplicationError(cause.message, type=name if name.startswith("TurnKit::") else f"TurnKit::{name}")
