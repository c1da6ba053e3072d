"""Transcript writes that keep behaviour §5.13 invariant 8: every tool call gets exactly one tool result.

All functions run inside an open :class:`~turnkit.store.store.StoreTx` and are idempotent: "append once" means no
message exists yet for the execution, so a retried activity never writes a second result.
"""

from __future__ import annotations

import json
from typing import Any, Final

from turnkit.events import announce, announce_message
from turnkit.kernel.records import (
    INTERRUPTED_MESSAGE,
    OPEN_EXECUTION_STATUSES,
    MessageRecord,
    ToolExecutionRecord,
    ToolExecutionStatus,
    TurnRecord,
)
from turnkit.store.store import StoreTx, utcnow

__all__ = [
    "TERMINAL_SKIP",
    "announce_settled",
    "append_tool_result",
    "complete_with_result",
    "fail_execution",
    "repair_transcript",
    "result_payload",
    "tool_calls_of",
    "tool_result_message",
]

TERMINAL_SKIP: Final = "not executed: turn ended by {name}"
NOT_EXECUTED: Final = "not executed: the turn ended before this call"


def result_payload(execution: ToolExecutionRecord) -> tuple[dict[str, Any], bool]:
    """What the model sees for a settled execution, and whether it is an error."""
    if execution.status in ("completed", "cancelled"):
        return dict(execution.result or {}), False
    message = (execution.error or {}).get("message") or INTERRUPTED_MESSAGE
    return {"error": True, "message": message}, True


def tool_result_message(
    execution: ToolExecutionRecord, *, interrupted: bool = False
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The content and metadata of the execution's tool-result message."""
    metadata: dict[str, Any] = {"tool_name": execution.tool_name}
    if interrupted or execution.status == "interrupted":
        metadata["interrupted"] = True
    content = [
        {
            "type": "tool_result",
            "tool_call_id": execution.tool_call_id,
            "text": result_text(execution),
            "error": result_payload(execution)[1],
        }
    ]
    return content, metadata


async def append_tool_result(
    tx: StoreTx, turn: TurnRecord, execution: ToolExecutionRecord, *, interrupted: bool = False
) -> MessageRecord:
    """Append the execution's tool-result message once; returns the existing one if it is already there."""
    content, metadata = tool_result_message(execution, interrupted=interrupted)
    message, created = await tx.append_tool_result(
        turn.conversation_id, turn_id=turn.id, tool_execution_id=execution.id, content=content, metadata=metadata
    )
    if created:
        announce_message(tx, message)
    return message


async def complete_with_result(
    tx: StoreTx, turn: TurnRecord, execution: ToolExecutionRecord, result: dict[str, Any]
) -> ToolExecutionRecord | None:
    """Settle an open execution as completed with ``result`` and append its tool-result message (once), in one step
    (``StoreTx.complete_tool_execution``): the execution as written, or None when it was settled otherwise first
    (interrupted, cancelled), with nothing written. The caller holds the root turn's and the conversation's locks."""
    done = await tx.complete_tool_execution(
        execution,
        conversation_id=turn.conversation_id,
        result=result,
        completed_at=utcnow(),
        result_message=tool_result_message,
    )
    if done is None:
        return None
    settled, message, created = done
    if created:
        announce_message(tx, message)
    return settled


def result_text(execution: ToolExecutionRecord) -> str:
    """The text of the execution's tool-result message: the JSON the model reads."""
    return json.dumps(result_payload(execution)[0], sort_keys=True, default=str)


def announce_settled(tx: StoreTx, turn: TurnRecord, execution: ToolExecutionRecord) -> None:
    """``tool_call.completed`` or ``tool_call.failed`` for an execution ``tx`` just settled (behaviour §3.8 step 13).

    Call it only when this transaction's compare-and-set won, so a call settles with one event. Interrupted calls
    have their own event (``tool_call.interrupted``), cancelled ones none.
    """
    common: dict[str, Any] = {"id": execution.tool_call_id, "name": execution.tool_name}
    chars = len(result_text(execution))
    if execution.status == "completed":
        announce(tx, "tool_call.completed", turn.id, turn.conversation_id, **common, result_chars=chars)
    elif execution.status == "failed":
        error = str((execution.error or {}).get("message") or "")
        announce(tx, "tool_call.failed", turn.id, turn.conversation_id, **common, error=error, result_chars=chars)


async def fail_execution(
    tx: StoreTx,
    turn: TurnRecord,
    execution: ToolExecutionRecord,
    message: str,
    *,
    details: dict[str, Any] | None = None,
    status: ToolExecutionStatus = "failed",
    from_: tuple[ToolExecutionStatus, ...] = OPEN_EXECUTION_STATUSES,
    append: bool = True,
) -> ToolExecutionRecord:
    """CAS an open execution to ``failed`` (or ``interrupted``) and append its error result if the CAS won.

    ``append=False`` defers the result message (a delegation group appends its results later, in call order).
    """
    error: dict[str, Any] = {"message": message}
    if details:
        error["details"] = details
    settled = await tx.claim_tool_execution(execution.id, from_=from_, to=status, error=error, completed_at=utcnow())
    if settled is None:  # someone settled it first: theirs stands (and its result message, written if missing)
        current = await tx.load_tool_execution(execution.id)
        if append:
            await append_tool_result(tx, turn, current)
        return current
    if append:
        await append_tool_result(tx, turn, settled)
    announce_settled(tx, turn, settled)
    return settled


def tool_calls_of(messages: list[MessageRecord]) -> list[dict[str, Any]]:
    """The ``tool_call`` parts of a turn's assistant messages, in order."""
    return [
        part
        for message in messages
        if message.role == "assistant"
        for part in message.content
        if part.get("type") == "tool_call"
    ]


async def repair_transcript(tx: StoreTx, turn: TurnRecord, *, skip_message: str = NOT_EXECUTED) -> None:
    """Give every tool call of ``turn`` a result (behaviour §5.8 repair): no proposed call is left unanswered.

    Open executions become ``interrupted`` (their outcome is unknown); settled ones get their real result; calls
    that never started get a cancelled execution whose result says ``skip_message`` (the turn ended, or human
    steering superseded them).
    """
    messages = await tx.list_turn_messages(turn.id)
    answered = {
        part.get("tool_call_id") for message in messages if message.kind == "tool_result" for part in message.content
    }
    for call in tool_calls_of(messages):
        call_id = str(call.get("id"))
        if call_id in answered:
            continue
        execution = await tx.find_tool_execution(turn.id, call_id)
        if execution is None:
            # No execution row means the call never started (rows are written before a tool runs): its outcome is
            # known, so it is skipped (cancelled), not "unknown" — and it uses no tool budget.
            execution, _ = await tx.create_tool_execution(
                turn_id=turn.id,
                tool_call_id=call_id,
                tool_name=str(call.get("name")),
                arguments=dict(call.get("arguments") or {}),
                status="cancelled",
                result={"skipped": True, "message": skip_message},
                completed_at=utcnow(),
            )
        if execution.status in OPEN_EXECUTION_STATUSES:
            await fail_execution(tx, turn, execution, INTERRUPTED_MESSAGE, status="interrupted")
        else:
            await append_tool_result(tx, turn, execution)
        answered.add(call_id)
