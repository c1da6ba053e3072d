"""Charging a model call to a turn: its usage and cost added to the turn's record (behaviour §6.4), and the tree's
``max_spend`` verdict right after it (§6.2).

The root tree's spend is read from its turns, so a charge is one write of the turn's row, inside the caller's
transaction (with whatever the call produced, so both commit or neither does). Every paid call is charged here: the
turn's model calls, compaction, output-policy judges, and ``paint`` / ``view_media``. And every paid call is asked
for only while the tree is within ``max_spend`` (:func:`spend_before_call`), so the spend passes the limit by the
calls already in flight at most.
"""

from __future__ import annotations

from typing import Any

from turnkit._engine.budget import limit_of, spend_denial
from turnkit.cost import Cost
from turnkit.kernel.errors import BudgetError
from turnkit.kernel.records import MessageRecord, TurnRecord
from turnkit.model import Usage
from turnkit.store.store import NewMessage, Store, StoreTx, utcnow

__all__ = ["append_charged", "charge_turn", "refuse_over_budget", "spend_before_call", "tree_spend_denial"]


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
    if limit_of(root, "max_spend") is None:
        return None  # no limit: nothing to read
    return spend_denial(root, await tx.tree_usage(root.id))


async def spend_before_call(store: Store, turn: TurnRecord) -> str | None:
    """The tree's ``max_spend`` verdict before a paid call of ``turn`` (behaviour §6.2): ``"cost limit reached"``
    when the tree has already spent more than its limit, so the call is not made; else None. Read without the root's
    lock: spend only grows, and the call's own charge is checked again after it (:func:`tree_spend_denial`)."""
    async with store.reads() as tx:
        return await tree_spend_denial(tx, turn)


async def refuse_over_budget(store: Store, turn: TurnRecord) -> None:
    """Raise :class:`BudgetError` when :func:`spend_before_call` refuses the paid call about to be made.

    Raises:
        BudgetError: ``"cost limit reached"``.
    """
    denial = await spend_before_call(store, turn)
    if denial is not None:
        raise BudgetError(denial)


def _add_cost_details(previous: Any, current: dict[str, Any]) -> dict[str, float]:
    totals: dict[str, float] = {str(k): float(v) for k, v in (previous or {}).items() if v is not None}
    for key, value in current.items():
        if value is not None:
            totals[key] = totals.get(key, 0.0) + float(value)
    return totals
