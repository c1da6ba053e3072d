"""Durable messaging (behaviour §5.11): deliveries are rows first, signals second.

A delivery is created idempotently by its globally unique key, then its destination lane is woken by
signal-with-start ``deliver``. The store is authoritative: a lost signal is repaired by :func:`reconcile`, a
duplicate signal is a no-op (the lane dedupes, and the store's compare-and-set on ``delivered_at`` has the last word).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from turnkit._engine.authorization import DENIAL_CLASS, Verdict, check
from turnkit.config import settings
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.names import DELIVER_SIGNAL, LANE_WORKFLOW, WAKE_SIGNAL
from turnkit.kernel.payloads import DeliverySignal, LaneInput
from turnkit.kernel.records import DeliveryRecord, TurnRecord
from turnkit.kernel.search_attributes import lane_search_attributes
from turnkit.store.store import Store, StoreTx, utcnow

__all__ = [
    "WAKE_SIGNAL",
    "callback_verdict",
    "completion_delivery",
    "create_delivery",
    "pending_completion",
    "reconcile",
    "signal_delivery",
    "turn_result",
    "wake_lane",
]


async def create_delivery(
    tx: StoreTx,
    *,
    source_conversation_id: str,
    destination_conversation_id: str,
    key: str,
    text: str,
    principal: Any = None,
    include_principal: bool = False,
    source_turn_id: str | None = None,
) -> DeliveryRecord:
    """Create (or find, by key) a delivery to an existing conversation; raises before writing anything if not.

    Raises:
        RecordNotFound: The destination conversation does not exist.
        ToolError: The key was already used for a different message (its payload is not revealed).
    """
    if not isinstance(text, str) or not text:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError("text is required")
    try:
        await tx.load_conversation(destination_conversation_id)
    except RecordNotFound:
        raise RecordNotFound(f"destination conversation not found: {destination_conversation_id}") from None
    payload: dict[str, Any] = {"text": text}
    if include_principal:
        payload["principal"] = principal
    delivery, _ = await tx.create_delivery(
        source_conversation_id=source_conversation_id,
        destination_conversation_id=destination_conversation_id,
        key=key,
        payload=payload,
        source_turn_id=source_turn_id,
    )
    return delivery


def turn_result(turn: TurnRecord) -> dict[str, Any]:
    """``SubAgentTool.result`` (behaviour §4.3): the shape of completion payloads and sub-agent results (no nils)."""
    result: dict[str, Any] = {
        "conversation_id": turn.conversation_id,
        "turn_id": turn.id,
        "status": turn.status,
        "result": turn.output_text or "",
        "output_data": turn.output_data,
        "error": turn.error,
    }
    return {key: value for key, value in result.items() if value is not None}


async def callback_verdict(turn: TurnRecord) -> Verdict:
    """Ask ``callback`` for a turn's completion callback, before its terminal write (never inside it).

    Allowed at once when the turn has no callback: the hook is only asked when there is something to deliver.
    """
    destination = turn.options.callback_conversation_id
    if not destination:
        return Verdict("callback", True)
    return await check("callback", turn.options.principal, turn=turn.id, destination_conversation=destination)


async def completion_delivery(tx: StoreTx, turn: TurnRecord, verdict: Verdict) -> DeliveryRecord | None:
    """The completion callback of a finished turn (key ``completion:<turn_id>``), created with its terminal write.

    ``verdict`` is :func:`callback_verdict`, asked before the transaction. Denied, the terminal state stands and
    ``options.callback_denied`` records the denial instead of a delivery (behaviour §7.4).
    """
    destination = turn.options.callback_conversation_id
    if not destination or not turn.terminal or turn.options.callback_denied is not None:
        return None  # the first decision stands, whatever a retry's hook says
    if not verdict.allowed:
        if await tx.find_delivery(f"completion:{turn.id}") is None:
            denied: dict[str, Any] = {"class": DENIAL_CLASS, "message": verdict.message, "at": utcnow().isoformat()}
            if verdict.hook_error is not None:
                denied["hook_error"] = verdict.hook_error
            await tx.update_turn(turn.id, options=turn.options.model_copy(update={"callback_denied": denied}))
        return None
    return await create_delivery(
        tx,
        source_conversation_id=turn.conversation_id,
        destination_conversation_id=str(destination),
        key=f"completion:{turn.id}",
        text=json.dumps(turn_result(turn), sort_keys=True, default=str),
        source_turn_id=turn.id,
    )


async def signal_delivery(client: Client, task_queue: str, delivery: DeliveryRecord) -> None:
    """Wake the destination lane: signal-with-start ``deliver`` (starts the lane if it is not running)."""
    conversation_id = delivery.destination_conversation_id
    await client.start_workflow(
        LANE_WORKFLOW,
        LaneInput(conversation_id=conversation_id),
        id=conversation_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        start_signal=DELIVER_SIGNAL,
        start_signal_args=[DeliverySignal(delivery_id=delivery.id)],
        # The agent is not known here: the lane adds it when it runs its first turn.
        search_attributes=lane_search_attributes(conversation_id) if settings.search_attributes else None,
    )


async def reconcile(
    store: Store, client: Client, task_queue: str, *, limit: int | None = None, since: datetime | None = None
) -> list[DeliveryRecord]:
    """Signal the lanes of every delivery still pending in the store (repairs lost signals); returns them.
    ``since``: only the deliveries created or changed since then.

    Safe to run at any time and any number of times: a delivery already applied, or one its lane already holds
    (input for a busy conversation waits in the lane until it is idle), is a no-op for its lane.
    """
    async with store.atomic() as tx:
        pending = await tx.list_deliveries(pending=True, limit=limit, since=since)
    for delivery in pending:
        await signal_delivery(client, task_queue, delivery)
    return pending


async def pending_completion(tx: StoreTx, turn_id: str) -> DeliveryRecord | None:
    """The completion callback of ``turn_id`` when it has one not delivered yet (to signal: :func:`signal_delivery`)."""
    delivery = await tx.find_delivery(f"completion:{turn_id}")
    return delivery if delivery is not None and delivery.delivered_at is None else None


async def wake_lane(client: Client, turn: TurnRecord) -> None:
    """After a sub-agent's ``turn``'s terminal write committed: tell its conversation's lane (idempotent).

    The lane may append the input it held back meanwhile (``wake``). A turn of the lane's own sends nothing here: the
    lane registers as its waiter when it needs its end (patch ``lane-follows-on-demand``, ``turnkit.follow_turn``),
    and is signalled with the waiters. No lane: nothing waits.
    """
    if turn.parent_turn_id is None:
        return
    handle = client.get_workflow_handle(turn.conversation_id)
    try:
        await handle.signal(WAKE_SIGNAL)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
