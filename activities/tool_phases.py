"""The store's side of one tool call, shared by both ways a call runs: the dynamic tool activity (``tool:<name>``,
:mod:`.tools`) and an application's own activity, opened and committed around it (``turnkit.open_tool`` and
``turnkit.commit_tool``, :mod:`.activity_tools`).

1. **Ask** the authorization hook about a call about to be opened (never inside a transaction).
2. **Open** (root turn lock): get or create the execution for ``(turn_id, tool_call_id)``. A settled execution is
   returned as it is (the tool never runs again). A new one passes the control boundary and is counted against the
   root tree's tool budgets; a denial, an unknown tool, unparseable arguments or a denied hook settle it ``failed``.
3. **Commit** (root turn lock): CAS ``running → completed`` and, only if the CAS won, append the tool-result message
   once; or **fail** the execution with the message the model sees. A late attempt that lost the CAS writes nothing.

Each phase is one transaction and idempotent; callers decide how to ride out a store outage (the tool activity
retries inside its attempt, the store calls retry as activities).
"""

from __future__ import annotations

from typing import Any, Final

from turnkit._engine.authorization import Verdict, check
from turnkit._engine.controls import control_boundary
from turnkit._engine.executions import open_tool_execution, read_arguments
from turnkit._engine.mcp_tools import mcp_tool
from turnkit._engine.transcript import announce_settled, append_tool_result, complete_with_result, fail_execution
from turnkit.agent import resolve_agent
from turnkit.config import settings
from turnkit.kernel.errors import BudgetError, ConfigError
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
from turnkit.store.store import Look, Store, utcnow
from turnkit.tools import Tool

__all__ = [
    "OVER_BUDGET",
    "Opened",
    "ask_tool",
    "budget_denial",
    "commit_result",
    "fail_call",
    "find_tool",
    "open_call",
    "outcome_of",
]

#: An opened call: its turn, its running execution, the conversation its tool's context shows (None unless the tool
#: reads its context) and the call with its arguments.
Opened = tuple[TurnRecord, ToolExecutionRecord, ConversationRecord | None, ToolCallRef]

#: The error details of a call whose body went over a budget (it ran, so it still counts as a tool execution).
OVER_BUDGET: Final = {"class": BudgetError.qualified_name, "over_budget": True}


async def ask_tool(store: Store, request: ToolCallInput, tool: Tool | None) -> Verdict:
    """Ask the authorization hook about ``tool`` for a call about to be opened (behaviour §3.8 step 7, §7.3), before
    the opening transaction; ``request.call`` carries its arguments.

    Every tool, ``send_message`` included; nothing to ask for an unknown tool, unparseable arguments (they fail
    anyway) or a call already opened (a retry, or a settled call's recovery).
    """
    if settings.authorize is None or tool is None or request.call.arguments_error:
        return Verdict("tool", True)
    async with store.atomic() as tx:
        turn = await tx.load_turn(request.turn_id)
        if await tx.find_tool_execution(turn.id, request.call.id) is not None:
            return Verdict("tool", True)
    return await check("tool", turn.options.principal, turn=turn, tool=tool, arguments=request.call.arguments)


async def open_call(
    store: Store,
    request: ToolCallInput,
    tool: Tool | None,
    verdict: Verdict,
    *,
    wrong_queue: str | None = None,
    attempt_runs_it: bool = True,
) -> ToolOutcome | Opened:
    """Open (or resume) the call's execution; with the conversation the tool's context shows and the call with its
    arguments (read here unless the authorization hook needed them first), in one transaction.

    ``attempt_runs_it``: the caller runs the tool itself, so an at-most-once call found running is a second attempt,
    which never runs (it is settled ``interrupted``). False where opening again runs nothing: ``turnkit.open_tool``
    runs again only when the workflow never scheduled the call's activity (its first result was not recorded).
    """
    call = request.call
    # The call's execution and the turn's latest response (its stored arguments) are read with the turn's lock,
    # in one statement (Look).
    look = Look.execution(request.turn_id, call.id)
    async with store.atomic(turn_id=request.root_turn_id, look=look) as tx:
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
        elif attempt_runs_it and tool is not None and tool.recovery != "replay_safe" and execution.status == "running":
            # A second attempt of an at-most-once call (should not happen with maximum_attempts=1): never re-run.
            settled = await fail_execution(tx, turn, execution, INTERRUPTED_MESSAGE, status="interrupted")
            return outcome_of(settled, tool)
        elif execution.status == "pending":
            claimed = await tx.claim_tool_execution(execution.id, from_="pending", to="running", started_at=utcnow())
            execution = claimed or await tx.load_tool_execution(execution.id)
        # The conversation only for a tool that sees its context (a store read per tool call fewer otherwise).
        conversation = await tx.load_conversation(turn.conversation_id) if tool is None or tool.reads_context else None
        return turn, execution, conversation, call


async def commit_result(
    store: Store, turn: TurnRecord, execution: ToolExecutionRecord, result: dict[str, Any], tool: Tool | None
) -> ToolOutcome:
    """Settle the running ``execution`` completed with ``result`` and its tool-result message; a result that comes too
    late (the call was interrupted or cancelled first) is dropped, and the execution's own result message is written
    if missing (every call gets one result)."""
    # The result's append locks the conversation: take it with the turn's lock, in one round trip.
    async with store.atomic(turn_id=turn.root_turn_id, conversation_id=turn.conversation_id) as tx:
        # The compare-and-set and the result's message, in one statement on PostgreSQL.
        settled = await complete_with_result(tx, turn, execution, result)
        if settled is None:  # interrupted or cancelled first: the late result is dropped
            current = await tx.load_tool_execution(execution.id)
            await append_tool_result(tx, turn, current)
            return outcome_of(current, tool)
        if isinstance(tool, LoadSkillTool):  # the skill's tools join the turn's tool set with this result
            await record_loaded_skill(tx, turn.id, str(result["key"]))
        announce_settled(tx, turn, settled)  # sent once this transaction committed
    return outcome_of(settled, tool)


async def fail_call(
    store: Store, turn: TurnRecord, execution: ToolExecutionRecord, message: str, details: dict[str, Any]
) -> ToolOutcome:
    """Settle the open ``execution`` failed with ``message`` (what the model sees) and its result message; first
    writer wins (``fail_execution`` announces ``tool_call.failed``)."""
    async with store.atomic(turn_id=turn.root_turn_id) as tx:
        settled = await fail_execution(tx, turn, execution, message, details=details)
    return outcome_of(settled, None)


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
    loaded skill owns it (so a skill's tool proposed before ``load_skill`` stays unknown), an MCP server's tool when
    ``policy`` names the server; None when unknown."""
    loaded = (policy.skill,) if policy is not None and policy.skill else ()
    try:
        agent = resolve_agent(agent_name)
    except ConfigError:
        return None
    if policy is not None and policy.mcp is not None:
        return mcp_tool(agent, tool_name, policy.mcp)
    return agent.tool(tool_name, loaded)
