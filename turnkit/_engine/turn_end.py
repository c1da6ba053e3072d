"""Turns whose workflow ended without a terminal record (issue 8 item 5): terminated, timed out, failed.

A turn's record is made terminal by its own workflow (the model activity or ``turnkit.finish_turn``). When the
workflow is terminated (by hand, or by the server at the history limit), times out or fails, nothing writes it, and
the record would stay ``running`` for good. Whoever notices (the lane that ran the turn, a lane following a turn across
continue-as-new, a caller of ``Turn.result()``) records it ``failed`` here. The write is a compare-and-set from every
non-terminal status, so it never overwrites a real end; what follows a terminal write (completion callback, waiters,
the sub-agent conversation's lane) happens as for any other end.
"""

from __future__ import annotations

from temporalio.client import Client

from turnkit._engine.deliveries import (
    callback_verdict,
    completion_delivery,
    pending_completion,
    signal_delivery,
    wake_lane,
)
from turnkit._engine.transcript import repair_transcript
from turnkit._engine.waits import signal_waiters, waiters_of
from turnkit.events import emit
from turnkit.kernel.records import ACTIVE_TURN_STATUSES, TurnRecord
from turnkit.store.store import Store, utcnow

__all__ = ["ENDED_CLASS", "announce_end", "fail_unfinished_turn"]

#: The error class recorded for a turn whose workflow ended without a terminal status.
ENDED_CLASS = "TurnKit::Error"


async def fail_unfinished_turn(
    store: Store, client: Client, task_queue: str, turn_id: str, reason: str, *, error_class: str = ENDED_CLASS
) -> tuple[TurnRecord, bool]:
    """Record ``turn_id`` ``failed`` with ``reason`` unless it is terminal already; then announce its end.

    Returns the record and whether this call failed it. Idempotent: a terminal record is left as it is (its
    announcements are repeated, which is harmless).
    """
    turn = await store.load_turn(turn_id)
    verdict = await callback_verdict(turn)  # asked before the terminal write, never inside it (behaviour §7.4)
    failed: TurnRecord | None = None
    async with store.atomic(turn_id=turn.root_turn_id) as tx:
        turn = await tx.load_turn(turn_id)
        if not turn.terminal:
            await repair_transcript(tx, turn)  # every tool call it proposed gets a result
            failed = await tx.claim_turn(
                turn.id,
                from_=ACTIVE_TURN_STATUSES,
                to="failed",
                error={"class": error_class, "message": reason},
                completed_at=utcnow(),
                claim_token=None,
            )
            turn = failed or await tx.load_turn(turn_id)
            await completion_delivery(tx, turn, verdict)  # committed with the terminal write (behaviour §5.7)
    if failed is not None:
        await emit("turn.failed", turn.id, turn.conversation_id, store=store, error=turn.error)
    await announce_end(store, client, task_queue, turn)
    return turn, failed is not None


async def announce_end(store: Store, client: Client, task_queue: str, turn: TurnRecord) -> None:
    """After ``turn``'s terminal write committed: signal its completion callback if still pending, every turn (and
    lane) that waits on it and, for a sub-agent's turn, its conversation's lane (idempotent).

    What to signal is read in one transaction (the callback and the waiters: one store trip per turn end, issue 9),
    then the signals go out in that order. ``turn`` as its terminal write left it proves that write committed, so
    the waiters are listed without reading the turn again; any other record has them read as ``waiters_of`` does.
    """
    async with store.reads() as tx:  # reads only: on PostgreSQL no BEGIN and COMMIT (Store.reads)
        delivery = await pending_completion(tx, turn.id)
        waiters = await (tx.list_waits(target_turn_id=turn.id) if turn.terminal else waiters_of(tx, turn.id))
    if delivery is not None:
        await signal_delivery(client, task_queue, delivery)
    # A lane that needs its turn's end registered a wait row naming the conversation (turnkit.follow_turn): it is
    # signalled here like any waiter. A lane with nothing more to run is not signalled at all.
    await signal_waiters(client, turn.id, waiters)
    await wake_lane(client, turn)  # needs only ids and lineage, which never change
