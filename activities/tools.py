"""Tool activities: one activity per tool call, activity type ``tool:<name>`` (a dynamic activity).

Exactly-once bookkeeping around an at-most-once or replay-safe body:

1. **Reserve** (root turn lock): get or create the execution for ``(turn_id, tool_call_id)``. A settled execution is
   returned as it is (the tool never runs again). A new one is counted against the root tree's tool budgets; a
   denial, an unknown tool name or unparseable arguments settle it ``failed`` at once.
2. **Run** the tool body with its :class:`~turnkit.tools.ToolContext` (idempotency key ``turnkit:tool:<id>``).
3. **Commit** (root turn lock): CAS ``running → completed|failed`` and, only if the CAS won, append the tool-result
   message once. A late attempt that lost the CAS writes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Final

from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from turnkit._activities.store_retry import retry_store
from turnkit._engine.authorization import Verdict, check
from turnkit._engine.builtin_tools import SendMessageTool
from turnkit._engine.controls import control_boundary
from turnkit._engine.deliveries import create_delivery, signal_delivery
from turnkit._engine.executions import open_tool_execution, read_arguments, with_arguments
from turnkit._engine.request import subject_prompt_of
from turnkit._engine.tool_queues import misrouted
from turnkit._engine.transcript import announce_settled, append_tool_result, complete_with_result, fail_execution
from turnkit._temporal.heartbeats import heartbeating
from turnkit._temporal.tracing import record_tool_call
from turnkit.agent import resolve_agent
from turnkit.config import settings
from turnkit.kernel.errors import BudgetError, ConfigError, RecordNotFound, ToolError, error_class_name
from turnkit.kernel.payloads import CallPolicy, ToolCallInput, ToolCallRef, ToolOutcome
from turnkit.kernel.records import (
    ACTIVE_TURN_STATUSES,
    INTERRUPTED_MESSAGE,
    OPEN_EXECUTION_STATUSES,
    ConversationRecord,
    ToolExecutionRecord,
    TurnRecord,
)
from turnkit.skills import LoadSkillTool, record_loaded_skill
from turnkit.store.storable import UnstorableValue
from turnkit.store.store import Look, Store, utcnow
from turnkit.tools import Tool, ToolContext, normalize_result

__all__ = ["TOOL_RAISED", "ToolActivities", "budget_denial", "find_tool", "outcome_of"]

#: The failure type of an at-most-once tool attempt whose body raised (its outcome is known: it failed). Any other
#: failure of such an attempt leaves the outcome unknown, and the workflow records the call "interrupted".
TOOL_RAISED = "TurnKit::ToolRaised"


class ToolActivities:
    """The dynamic tool activity, bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(dynamic=True)
    async def run_tool(self, args: Sequence[RawValue]) -> ToolOutcome:
        """Run one tool call (activity type ``tool:<name>``); see the module docstring."""
        request: ToolCallInput = activity.payload_converter().from_payload(args[0].payload, ToolCallInput)
        record_tool_call(request)
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
            store=self.store,
            context=copy.deepcopy(turn.options.context),
            subject=None if conversation is None else conversation.subject,
            subject_prompt="" if conversation is None else subject_prompt_of(conversation),
        )
        try:
            if isinstance(tool, SendMessageTool):
                result = await self._send_message(turn, execution, tool, request.call.arguments)
            else:
                async with heartbeating():
                    result = await tool.invoke(request.call.arguments, context)
        except _Denied as err:
            return await self._fail(turn, execution, err.verdict.message, err.verdict.details)
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
            async with self.store.atomic() as tx:
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
    ) -> ToolOutcome | tuple[TurnRecord, ToolExecutionRecord, ConversationRecord | None, ToolCallRef]:
        verdict = await self._ask_tool(request, tool)
        return await self._reserve_in_tx(request, tool, verdict, wrong_queue)

    async def _ask_tool(self, request: ToolCallInput, tool: Tool | None) -> Verdict:
        """Ask ``tool`` for a call about to be opened, before the reserving transaction (behaviour §3.8 step 7, §7.3).

        Every tool, ``send_message`` included; nothing to ask for an unknown tool, unparseable arguments (they fail
        anyway) or a call already opened (a retry, or a settled call's recovery).
        """
        if settings.authorize is None or tool is None or request.call.arguments_error:
            return Verdict("tool", True)
        async with self.store.atomic() as tx:
            turn = await tx.load_turn(request.turn_id)
            if await tx.find_tool_execution(turn.id, request.call.id) is not None:
                return Verdict("tool", True)
        return await check("tool", turn.options.principal, turn=turn, tool=tool, arguments=request.call.arguments)

    async def _reserve_in_tx(
        self,
        request: ToolCallInput,
        tool: Tool | None,
        verdict: Verdict,
        wrong_queue: str | None = None,
    ) -> ToolOutcome | tuple[TurnRecord, ToolExecutionRecord, ConversationRecord | None, ToolCallRef]:
        """Open (or resume) the call's execution; with the conversation the tool's context shows and the call with
        its arguments (read here unless the authorization hook needed them first), in the same transaction."""
        call = request.call
        # The call's execution and the turn's latest response (its stored arguments) are read with the turn's lock,
        # in one statement (Look).
        look = Look.execution(request.turn_id, call.id)
        async with self.store.atomic(turn_id=request.root_turn_id, look=look) as tx:
            turn = await tx.load_turn(request.turn_id)
            execution = await tx.find_tool_execution(turn.id, call.id)
            if execution is not None and execution.status not in OPEN_EXECUTION_STATUSES:
                await append_tool_result(tx, turn, execution)  # recovery: make sure its result is in the transcript
                return outcome_of(execution, tool)
            if turn.status == "waiting" or turn.status not in ACTIVE_TURN_STATUSES:
                return ToolOutcome(outcome="stopped")  # cancelled: nothing more runs
            [call] = await read_arguments(tx, turn.id, [call])  # large arguments come from the store
            if execution is None:
                # The control boundary before an external effect (behaviour §5.10).
                boundary, turn = await control_boundary(tx, turn)
                if boundary is not None:
                    return ToolOutcome(outcome=boundary)
                if turn.status == "pending":  # resumed after a pause
                    turn = await tx.claim_turn(turn.id, from_="pending", to="running") or turn
                execution, denial = await open_tool_execution(
                    tx, turn, tool_call_id=call.id, tool_name=call.name, arguments=call.arguments
                )
                if denial is not None:
                    return outcome_of(execution, tool, budget_error=denial)
                failure: tuple[str, dict[str, Any]] | None = None
                if tool is None:
                    failure = (f"unknown tool: {call.name}", {"class": "TurnKit::ToolError"})
                elif wrong_queue is not None:  # never run it where it does not belong (a box without its GPU)
                    failure = (wrong_queue, {"class": "TurnKit::ConfigError"})
                elif call.arguments_error:
                    failure = (call.arguments_error, {"class": "TurnKit::ToolValidationError"})
                elif not verdict.allowed:  # asked before this transaction
                    failure = (verdict.message, verdict.details)
                if failure is not None:
                    settled = await fail_execution(tx, turn, execution, failure[0], details=failure[1])
                    return outcome_of(settled, tool)
            elif tool is not None and tool.recovery != "replay_safe" and execution.status == "running":
                # A second attempt of an at-most-once call (should not happen with maximum_attempts=1): never re-run.
                settled = await fail_execution(tx, turn, execution, INTERRUPTED_MESSAGE, status="interrupted")
                return outcome_of(settled, tool)
            elif execution.status == "pending":
                claimed = await tx.claim_tool_execution(
                    execution.id, from_="pending", to="running", started_at=utcnow()
                )
                execution = claimed or await tx.load_tool_execution(execution.id)
            # The conversation only for a tool that sees its context (a store read per tool call fewer otherwise).
            conversation = (
                await tx.load_conversation(turn.conversation_id) if tool is None or tool.reads_context else None
            )
            return turn, execution, conversation, call

    async def _complete(
        self, turn: TurnRecord, execution: ToolExecutionRecord, result: dict[str, Any], tool: Tool
    ) -> ToolOutcome:
        # The body ran: its result is recorded however long the store is away (heartbeating meanwhile), so the model
        # sees it; should the attempt die anyway, the call is "interrupted", never run again.
        return await retry_store(lambda: self._commit(turn, execution, result, tool), what="tool result")

    async def _commit(
        self, turn: TurnRecord, execution: ToolExecutionRecord, result: dict[str, Any], tool: Tool
    ) -> ToolOutcome:
        # The result's append locks the conversation: take it with the turn's lock, in one round trip.
        async with self.store.atomic(turn_id=turn.root_turn_id, conversation_id=turn.conversation_id) as tx:
            # The compare-and-set and the result's message, in one statement on PostgreSQL.
            settled = await complete_with_result(tx, turn, execution, result)
            if settled is None:  # interrupted or cancelled first: the late result is dropped
                # Its result message (e.g. "outcome unknown") is written if missing: every call gets one result.
                current = await tx.load_tool_execution(execution.id)
                await append_tool_result(tx, turn, current)
                return outcome_of(current, tool)
            if isinstance(tool, LoadSkillTool):  # the skill's tools join the turn's tool set with this result
                await record_loaded_skill(tx, turn.id, str(result["key"]))
            announce_settled(tx, turn, settled)  # sent once this transaction committed
        return outcome_of(settled, tool)

    async def _fail(
        self, turn: TurnRecord, execution: ToolExecutionRecord, message: str, details: dict[str, Any]
    ) -> ToolOutcome:
        async def write() -> ToolExecutionRecord:
            async with self.store.atomic(turn_id=turn.root_turn_id) as tx:
                return await fail_execution(tx, turn, execution, message, details=details)

        settled = await retry_store(write, what="tool failure")  # fail_execution announces tool_call.failed
        return outcome_of(settled, None)


#: The error details of a call whose body went over a budget (it ran, so it still counts as a tool execution).
OVER_BUDGET: Final = {"class": BudgetError.qualified_name, "over_budget": True}


class _Denied(Exception):
    """An authorization denial inside a coordination tool: a failed execution with ``authorization_denied``."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.message)
        self.verdict = verdict


def outcome_of(execution: ToolExecutionRecord, tool: Tool | None, *, budget_error: str | None = None) -> ToolOutcome:
    """The workflow's view of an execution (the same on a retry as on the attempt that settled it)."""
    terminal = bool(tool is not None and tool.is_terminal and execution.status == "completed")
    budget_error = budget_error or budget_denial(execution)
    outcome = "budget_exceeded" if budget_error else "terminal" if terminal else "done"
    return ToolOutcome(outcome=outcome, execution_id=execution.id, status=execution.status, budget_error=budget_error)


def budget_denial(execution: ToolExecutionRecord) -> str | None:
    """The budget denial that settled ``execution``, if one did (it fails the turn, on a retry too)."""
    error = execution.error or {}
    details = error.get("details") or {}
    over = isinstance(details, dict) and (details.get("budget_denied") or details.get("over_budget"))
    if execution.status == "failed" and over:
        return str(error.get("message") or "")
    return None


def find_tool(agent_name: str, tool_name: str, policy: CallPolicy | None = None) -> Tool | None:
    """The tool a call names, as the model activity resolved it: a skill's tool only when ``policy`` says which
    loaded skill owns it (so a skill's tool proposed before ``load_skill`` stays unknown); None when unknown."""
    loaded = (policy.skill,) if policy is not None and policy.skill else ()
    try:
        return resolve_agent(agent_name).tool(tool_name, loaded)
    except ConfigError:
        return None
