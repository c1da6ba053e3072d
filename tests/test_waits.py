"""Wait-graph rules in the store (behaviour §5.5, T63-T66), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from turnkit._engine.waits import add_waits
from turnkit.kernel.errors import ToolError
from turnkit.kernel.records import TurnRecord
from turnkit.store import Store
from turnkit.store.store import utcnow


async def submitted_turn(store: Store, conversation_id: str | None = None) -> TurnRecord:
    async with store.atomic() as tx:
        if conversation_id is None:
            conversation_id = (await tx.create_conversation(agent_name="a")).id
        return await tx.create_turn(conversation_id=conversation_id, agent_name="a", submitted_at=utcnow())


async def waits_of(store: Store, turn: TurnRecord) -> list[str]:
    async with store.atomic() as tx:
        return [w.target_turn_id for w in await tx.list_waits(turn_id=turn.id)]


async def test_concurrent_opposite_waits_accept_exactly_one(store: Store) -> None:
    """T64: two submitted turns wait on each other concurrently: exactly one edge is accepted, the other call gets
    the "cycle" error, and the store holds 1 wait."""
    a, b = await submitted_turn(store), await submitted_turn(store)

    async def wait(turn: TurnRecord, target: TurnRecord) -> None:
        async with store.atomic(turn_id=turn.root_turn_id) as tx:
            await add_waits(tx, turn, [target.id])

    results = await asyncio.gather(wait(a, b), wait(b, a), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 1 and isinstance(errors[0], ToolError) and "cycle" in str(errors[0])
    assert len(await waits_of(store, a)) + len(await waits_of(store, b)) == 1


async def test_a_chain_cannot_be_closed(store: Store) -> None:
    """T63: with r0 waiting on r1 and r1 on r2, ``r2`` waiting on r0 raises ``ToolError`` "wait would create a cycle"
    and leaves r2 with no waits."""
    r0, r1, r2 = [await submitted_turn(store) for _ in range(3)]
    async with store.atomic() as tx:
        await add_waits(tx, r0, [r1.id])
        await add_waits(tx, r1, [r2.id])
    with pytest.raises(ToolError, match="wait would create a cycle"):
        async with store.atomic() as tx:
            await add_waits(tx, r2, [r0.id])
    assert await waits_of(store, r2) == []


async def test_rejected_waits_leave_no_edges(store: Store) -> None:
    """T66: a wait on the turn itself, on an unsubmitted turn, or on unfinished work in the same conversation raises
    ``ToolError`` with its message, and the valid edge requested alongside rolls back, leaving no waits."""
    a, b = await submitted_turn(store), await submitted_turn(store)
    same_lane = await submitted_turn(store, a.conversation_id)
    async with store.atomic() as tx:
        unsubmitted = await tx.create_turn(conversation_id=b.conversation_id, agent_name="a")
    cases = [
        ([b.id, a.id], "a turn cannot wait for itself"),
        ([b.id, unsubmitted.id], "wait targets must be submitted"),
        ([b.id, same_lane.id], "cannot wait for unfinished work in the same conversation"),
    ]
    for targets, message in cases:
        with pytest.raises(ToolError, match=message):
            async with store.atomic() as tx:
                await add_waits(tx, a, targets)
        assert await waits_of(store, a) == []  # the valid edge to b rolled back with the rejected one
