"""Tool activities: one activity per tool call, activity type ``tool:<name>`` (a dynamic activity).

Exactly-once bookkeeping around an at-most-once or replay-safe body (the store's phases are :mod:`.tool_phases`,
shared with the application's own activities as tools):

1. **Reserve** (root turn lock): get or create the execution for ``(turn_id, tool_call_id)``. A settled execution is
   returned as it is (the tool never runs again). A new one is counted against the root tree's tool budgets; a
   denial, an unknown tool name or unparseable arguments settle it ``failed`` at once.
2. **Run** the tool body with its :class:`~turnkit.tools.ToolContext` (idempotency key ``turnkit:tool:<id>``).
3. **Commit** (root turn lock): CAS ``running → completed|failed`` and, only if the CAS won, append the tool-result
   message once. A late attempt that lost the CAS writes nothing.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import suppress
from typing import Any, TypeVar

from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from turnkit._activities.store_retry import retry_store
from turnkit._activities.tool_phases import (
    OVER_BUDGET,
    Opened,
    ask_tool,
    budget_denial,
    commit_result,
    fail_call,
    find_tool,
    open_call,
    outcome_of,
)
from turnkit._engine.authorization import Verdict, check
from turnkit._engine.builtin_tools import SendMessageTool
from turnkit._engine.callbacks import callbacks_within
from turnkit._engine.deliveries import create_delivery, signal_delivery
from turnkit._engine.executions import with_arguments
from turnkit._engine.request import subject_prompt_of
from turnkit._engine.tool_queues import misrouted
from turnkit._engine.tool_store import ToolStore, fence_execution
from turnkit._temporal.heartbeats import heartbeating
from turnkit._temporal.logs import log_ids
from turnkit._temporal.tracing import tool_call_span
from turnkit.config import settings
from turnkit.kernel.errors import (
    AuthorizationError,
    BudgetError,
    LostClaim,
    RecordNotFound,
    ToolError,
    ToolOutcomeUnknown,
    error_class_name,
)
from turnkit.kernel.payloads import ToolCallInput, ToolOutcome
from turnkit.kernel.records import DeliveryRecord, ToolExecutionRecord, TurnRecord
from turnkit.store.storable import UnstorableValue
from turnkit.store.store import Store
from turnkit.tools import Tool, ToolContext, normalize_result

__all__ = ["TOOL_RAISED", "ToolActivities", "budget_denial", "find_tool", "outcome_of"]

#: The failure type of an at-most-once tool attempt whose body raised (its outcome is known: it failed). Any other
#: failure of such an attempt leaves the outcome unknown, and the workflow records the call "interrupted".
TOOL_RAISED = "TurnKit::ToolRaised"
T = TypeVar("T")


class ToolActivities:
    """The dynamic tool activity, bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(dynamic=True)
    async def run_tool(self, args: Sequence[RawValue]) -> ToolOutcome:
        """Run one tool call (activity type ``tool:<name>``); see the module docstring."""
        request: ToolCallInput = activity.payload_converter().from_payload(args[0].payload, ToolCallInput)
        log_ids(request.turn_id, request.conversation_id)  # in this activity's context only
        # The hook's questions (before the body, and the body's own) answer within the tool's timeout, as the body
        # must; the rest of the attempt's time is the store phases'.
        body_timeout = request.call.policy.body_timeout if request.call.policy is not None else None
        with tool_call_span(request), callbacks_within(body_timeout):  # the span `execute_tool {name}` when traced
            return await self._run_tool(request)

    async def _run_tool(self, request: ToolCallInput) -> ToolOutcome:
        # Store phases ride out a database outage inside the attempt (issue 8): an at-most-once attempt is never
        # retried, so a failure here would otherwise record the call as failed.
        if settings.authorize is not None:
            # The hook sees the arguments before the reserving transaction (it never runs inside one), so they are
            # read first; without a hook the reserving transaction reads them (one store trip less per tool call).
            [call] = await retry_store(  # large arguments come from the store
                lambda: with_arguments(self.store, request.turn_id, [request.call]), what="tool arguments"
            )
            request = request.model_copy(update={"call": call})
        tool = find_tool(request.agent_name, request.call.name, request.call.policy)
        wrong_queue = misrouted(tool, activity.info().task_queue) if tool is not None else None
        reserved = await retry_store(lambda: self._reserve(request, tool, wrong_queue), what="tool reserve")
        if isinstance(reserved, ToolOutcome):
            return reserved
        turn, execution, conversation, call = reserved
        request = request.model_copy(update={"call": call})
        assert tool is not None  # _reserve settles unknown tools
        context = ToolContext(
            turn_id=turn.id,
            conversation_id=turn.conversation_id,
            root_turn_id=turn.root_turn_id,
            execution_id=execution.id,
            tool_call_id=execution.tool_call_id,
            idempotency_key=execution.idempotency_key,
            principal=turn.options.principal,
            agent_name=turn.agent_name,
            attempt=activity.info().attempt + request.attempts_before,
            # Never the worker's store: a view whose every write is fenced by this execution (behaviour §5.4).
            store=ToolStore(
                self.store,
                turn_id=turn.id,
                conversation_id=turn.conversation_id,
                root_turn_id=turn.root_turn_id,
                execution_id=execution.id,
                principal=turn.options.principal,
                signal=_signaller(),
            ),
            context=copy.deepcopy(turn.options.context),
            subject=None if conversation is None else conversation.subject,
            subject_prompt="" if conversation is None else subject_prompt_of(conversation),
        )
        try:
            if isinstance(tool, SendMessageTool):
                result = await self._send_message(turn, execution, tool, request.call.arguments)
            else:
                async with heartbeating():
                    result = await _within(tool.invoke(request.call.arguments, context), request)
        except _Denied as err:
            return await self._fail(turn, execution, err.verdict.message, err.verdict.details)
        except AuthorizationError as err:
            # A denied action inside the body (its context's deliver): a denied call, as a denied tool is.
            return await self._fail(turn, execution, str(err), Verdict("tool", False).details)
        except LostClaim as err:
            # The call was revoked (cancelled, interrupted) while the body ran: whoever revoked it settled it, so the
            # CAS below loses and the settled state is what the workflow gets; never a retry of a revoked call.
            return await self._fail(turn, execution, str(err), {"class": error_class_name(err)})
        except UnstorableValue as err:
            # The body ran and its effect happened; only its result cannot be stored (normalize_result: circular).
            # Never report it as not run, never run it again (a replay-safe retry would build the same result): it
            # completes, and the model is told why there is no result (issue 8 item 11).
            result = {"result_unstorable": f"the tool ran, but {err}"}
        except BudgetError as err:
            # A paid call inside the tool (paint, view_media) took the tree over max_spend: the call fails with the
            # budget error and so does the turn (behaviour §3.12 step 3), as after a model call over budget.
            return await self._fail(turn, execution, str(err), OVER_BUDGET)
        except ToolError as err:  # includes ToolValidationError: the model sees it and the turn goes on
            return await self._fail(turn, execution, str(err), {"class": error_class_name(err)})
        except ToolOutcomeUnknown:
            # The call may have had its effect: never "failed". A replay-safe tool is retried; an at-most-once call is
            # settled "interrupted" by the workflow, as when its worker dies.
            raise
        except Exception as err:
            if tool.recovery == "replay_safe":
                raise  # Temporal retries with backoff, same execution, same idempotency key
            # At most once: the body raised, so its outcome is known (it failed); report it, never re-run it.
            message = f"{type(err).__name__}: {err}"
            try:
                return await self._fail(turn, execution, message, {"class": type(err).__name__})
            except Exception as store_err:
                # Not even the failure could be recorded: say it is the tool that raised, so the workflow records
                # the execution failed (any other failure of an at-most-once attempt is "interrupted").
                raise ApplicationError(message, type=TOOL_RAISED, non_retryable=True) from store_err
        return await self._complete(turn, execution, normalize_result(result), tool)

    async def _send_message(
        self, turn: TurnRecord, execution: ToolExecutionRecord, tool: Tool, arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """The ``send_message`` tool: a delivery keyed ``message:<execution id>`` (stable across retries)."""
        args = tool.validate_arguments(arguments)
        principal = turn.options.principal
        destination = str(args["conversation_id"])
        verdict = await check(
            "send_message", principal, source_conversation=turn.conversation_id, destination_conversation=destination
        )
        if not verdict.allowed:
            raise _Denied(verdict)
        try:
            async with self.store.atomic(turn_id=turn.root_turn_id) as tx:
                await fence_execution(tx, execution.id)  # a tool's every write is fenced by its call
                delivery = await create_delivery(
                    tx,
                    source_conversation_id=turn.conversation_id,
                    destination_conversation_id=destination,
                    key=f"message:{execution.id}",
                    text=str(args["text"]),
                    source_turn_id=turn.id,
                )
        except RecordNotFound as err:
            raise ToolError(str(err)) from err
        await signal_delivery(activity.client(), activity.info().task_queue, delivery)
        return delivery.model_dump(mode="json")

    async def _reserve(
        self, request: ToolCallInput, tool: Tool | None, wrong_queue: str | None
    ) -> ToolOutcome | Opened:
        verdict = await ask_tool(self.store, request, tool)
        return await open_call(self.store, request, tool, verdict, wrong_queue=wrong_queue)

    async def _complete(
        self, turn: TurnRecord, execution: ToolExecutionRecord, result: dict[str, Any], tool: Tool
    ) -> ToolOutcome:
        # The body ran: its result is recorded however long the store is away (heartbeating meanwhile), so the model
        # sees it; should the attempt die anyway, the call is "interrupted", never run again.
        return await retry_store(lambda: commit_result(self.store, turn, execution, result, tool), what="tool result")

    async def _fail(
        self, turn: TurnRecord, execution: ToolExecutionRecord, message: str, details: dict[str, Any]
    ) -> ToolOutcome:
        return await retry_store(lambda: fail_call(self.store, turn, execution, message, details), what="tool failure")


async def _within(body: Coroutine[Any, Any, T], request: ToolCallInput) -> T:
    """The tool body, bounded by the tool's own timeout (its policy's ``body_timeout``): the activity's start-to-close
    timeout also covers the store phases around it, so a commit that waits for the database does not spend the tool's
    time. A body that runs out of it ended with an unknown outcome, as one whose attempt timed out: an at-most-once
    call is settled ``interrupted``, a replay-safe one retried. The body is not waited for then (one that ignores its
    cancellation goes on, as it would past a timed-out attempt: its later writes meet the execution's fence)."""
    limit = request.call.policy.body_timeout if request.call.policy is not None else None
    if limit is None:  # a policy of an older release: the activity's own timeout bounds the body
        return await body
    running = asyncio.ensure_future(body)
    try:
        await asyncio.wait({running}, timeout=limit)
    except asyncio.CancelledError:
        running.cancel()  # the attempt was cancelled (the turn was): the body unwinds before the attempt ends
        with suppress(BaseException):
            await running
        raise
    if running.done():
        return running.result()  # what the body returned, or raised (its own TimeoutError included)
    running.cancel()
    running.add_done_callback(_retrieved)
    raise ToolOutcomeUnknown(f"tool {request.call.name} did not finish within {limit:g} s")


def _retrieved(task: asyncio.Future[Any]) -> None:
    """Retrieve the end of a body that ran past its time (nobody awaits it any more)."""
    if not task.cancelled():
        task.exception()


def _signaller() -> Callable[[DeliveryRecord], Awaitable[None]]:
    """Wakes a delivery's destination lane from this activity (a tool's ``context.store.deliver``)."""
    client, task_queue = activity.client(), activity.info().task_queue

    async def signal(delivery: DeliveryRecord) -> None:
        await signal_delivery(client, task_queue, delivery)

    return signal


class _Denied(Exception):
    """An authorization denial inside a coordination tool: a failed execution with ``authorization_denied``."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.message)
        self.verdict = verdict
