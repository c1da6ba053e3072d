"""Opening a tool execution: the row is created and the root tree's tool budget reserved in one transaction."""

from __future__ import annotations

from typing import Any, Final

from turnkit._engine.budget import tool_execution_denial
from turnkit._engine.transcript import fail_execution
from turnkit.kernel.payloads import ToolCallRef
from turnkit.kernel.records import MessageRecord, ToolExecutionRecord, TurnRecord
from turnkit.store.store import Store, StoreTx, utcnow

__all__ = ["BUDGET_DENIED", "open_tool_execution", "read_arguments", "with_arguments"]

BUDGET_DENIED: Final = {"class": "TurnKit::BudgetError", "budget_denied": True}


async def open_tool_execution(
    tx: StoreTx,
    turn: TurnRecord,
    *,
    tool_call_id: str,
    tool_name: str,
    arguments: dict[str, Any],
    status: str = "running",
) -> tuple[ToolExecutionRecord, str | None]:
    """Create the execution of a new call and reserve tool budget for it over the root tree (behaviour §6.2).

    Call it under the root turn's lock, in the transaction that found no execution for ``tool_call_id`` (the row is
    not looked for again). A denied reservation settles the execution ``failed`` with ``budget_denied`` (its result
    appended) and returns the denial message, which fails the turn.
    """
    root = turn if turn.root_turn_id == turn.id else await tx.load_turn(turn.root_turn_id)
    # The root's running totals (one row), not the tree's executions: the check costs the same at every iteration.
    denial = tool_execution_denial(root, await tx.tree_usage(root.id), tool_name)
    execution, _ = await tx.create_tool_execution(
        turn_id=turn.id,
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        arguments=arguments,
        status=status,
        started_at=utcnow(),
        found_absent=True,  # every caller looked for it first, under the same lock: one SELECT per tool call fewer
    )
    if denial is not None:
        execution = await fail_execution(tx, turn, execution, denial, details=BUDGET_DENIED)
    return execution, denial


async def with_arguments(store: Store, turn_id: str, calls: list[ToolCallRef]) -> list[ToolCallRef]:
    """``calls`` with the arguments of every call that travelled without them, read from the turn's stored assistant
    message (the newest one that proposed the call id). Calls that carry their arguments are returned as they are."""
    if not any(call.arguments_stored for call in calls):
        return calls
    async with store.atomic() as tx:
        return await read_arguments(tx, turn_id, calls)


async def read_arguments(tx: StoreTx, turn_id: str, calls: list[ToolCallRef]) -> list[ToolCallRef]:
    """:func:`with_arguments` in the caller's transaction (a caller that opens one anyway saves a store trip)."""
    wanted = {call.id for call in calls if call.arguments_stored}
    if not wanted:
        return calls
    # The calls being run are the latest response's: one indexed read (issue 9). Only if one is not there (a
    # response written before responses carried their request id), the turn's messages are read.
    latest = await tx.latest_response(turn_id)
    stored = _call_arguments([latest] if latest is not None else [])
    if not wanted <= stored.keys():
        stored = _call_arguments(await tx.list_turn_messages(turn_id))
    return [
        call.model_copy(update={"arguments": stored.get(call.id, {}), "arguments_stored": False})
        if call.arguments_stored
        else call
        for call in calls
    ]


def _call_arguments(messages: list[MessageRecord]) -> dict[str, dict[str, Any]]:
    """Call id -> arguments of the ``tool_call`` parts of ``messages``' assistant messages (a later one wins)."""
    stored: dict[str, dict[str, Any]] = {}
    for message in messages:  # oldest first: a later message's call wins
        if message.role == "assistant":
            for part in message.content:
                if part.get("type") == "tool_call":
                    stored[str(part.get("id"))] = dict(part.get("arguments") or {})
    return stored
