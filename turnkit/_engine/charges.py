"""Charging a model call to a turn: its usage and cost added to the turn's record (behaviour §6.4), and the tree's
``max_spend`` verdict right after it (§6.2).

The root tree's spend is read from its turns, so a charge is one write of the turn's row, inside the caller's
transaction (with whatever the call produced, so both commit or neither does). Every paid call is charged here: the
turn's model calls, compaction, output-policy judges, and ``paint`` / ``view_media``.
"""

from __future__ import annotations

from typing import Any

from turnkit._engine.budget import limits_of, spend_denial
from turnkit.cost import Cost
from turnkit.kernel.records import MessageRecord, TurnRecord
from turnkit.model import Usage
from turnkit.store.store import NewMessage, StoreTx, utcnow

__all__ = ["append_charged", "charge_turn", "tree_spend_denial"]


async def charge_turn(tx: StoreTx, turn: TurnRecord, usage: Usage, cost: Cost, **updates: Any) -> TurnRecord:
    """Add one model call's usage and cost to ``turn`` (with ``updates`` in the same write); refreshes the heartbeat."""
    return await tx.update_turn(turn.id, **_charged(turn, usage, cost), **updates)


async def append_charged(
    tx: StoreTx, turn: TurnRecord, usage: Usage, cost: Cost, *, message: NewMessage, **updates: Any
) -> tuple[MessageRecord, TurnRecord]:
    """Append the message a model call answered with (``message``: :meth:`StoreTx.append_message`'s arguments) and
    charge the call to ``turn`` as :func:`charge_turn` does: the message and the turn as written (one statement on
    PostgreSQL, ``StoreTx.append_message_and_update_turn``)."""
    return await tx.append_message_and_update_turn(
        turn.conversation_id, message=message, turn_id=turn.id, turn_updates={**_charged(turn, usage, cost), **updates}
    )


def _charged(turn: TurnRecord, usage: Usage, cost: Cost) -> dict[str, Any]:
    """The turn's usage, cost and heartbeat after one more model call's ``usage`` and ``cost``."""
    usage_record = (Usage.from_dict(turn.usage) + usage).to_record()
    details = _add_cost_details(turn.usage.get("cost_details"), cost.to_dict())
    if details:
        usage_record["cost_details"] = details
    total_cost = turn.cost
    if cost.total is not None:
        total_cost = (total_cost or 0.0) + cost.total
    return {"usage": usage_record, "cost": total_cost, "heartbeat_at": utcnow()}


async def tree_spend_denial(tx: StoreTx, turn: TurnRecord) -> str | None:
    """The root tree's ``max_spend`` verdict after ``turn``'s latest charge (behaviour §6.2): ``"cost limit reached"``
    when the tree's spend is now over it, else None. The root's running total: one row, whatever the tree's size."""
    root = turn if turn.root_turn_id == turn.id else await tx.load_turn(turn.root_turn_id)
    if limits_of(root).max_spend is None:
        return None  # no limit: nothing to read
    return spend_denial(root, await tx.tree_usage(root.id))


def _add_cost_details(previous: Any, current: dict[str, Any]) -> dict[str, float]:
    totals: dict[str, float] = {str(k): float(v) for k, v in (previous or {}).items() if v is not None}
    for key, value in current.items():
        if value is not None:
            totals[key] = totals.get(key, 0.0) + float(value)
    return totals
