"""Turns whose submission the lane lost, found by the next submission so that they still run first.

The lane's submit is a local activity: it commits the trigger message and the pending turn inside the workflow task
that accepts the update. When the caller, the worker and the Temporal server all die before that task completes, the
update is gone and the turn stays ``pending`` with no workflow, unknown to its lane. The next store call of the lane
that queues a turn (``turnkit.submit_turn``, ``turnkit.deliver`` with a wake) passes the newest turn the lane knows;
the store answers with the submitted turns from that one on that have not started, and the lane queues the ones it
does not know ahead of the new turn. The lane queues in submission order, so a lost turn is always newer than every
turn the lane knows: it takes its place in the conversation's order (docs/design.md, "Lost submissions"). A lost turn
that no later submission follows is run by the workers' search for lost submissions
(:mod:`turnkit._ops.lost_submits`).
"""

from __future__ import annotations

from turnkit._engine.turn_build import queued_with_root
from turnkit.kernel.payloads import QueuedTurn
from turnkit.kernel.records import TurnRecord
from turnkit.store.store import StoreTx

__all__ = ["earlier_turns"]


async def earlier_turns(
    tx: StoreTx, conversation_id: str, known_turn_id: str | None, *, before: TurnRecord | None
) -> list[QueuedTurn]:
    """The conversation's unstarted submitted turns from ``known_turn_id`` on, submitted before ``before`` (the turn
    being queued now; None: every one), oldest first, as the lane queues them. The lane skips those it knows."""
    found = await tx.unqueued_turns(conversation_id, known_turn_id)
    earlier: list[QueuedTurn] = []
    for turn in found:
        if before is not None and (turn.id == before.id or _key(turn) > _key(before)):
            continue
        earlier.append(await queued_with_root(tx, turn))
    return earlier


def _key(turn: TurnRecord) -> tuple[str, str]:
    """Submission order: ``submitted_at``, then the id (the store's order too)."""
    return (turn.submitted_at.isoformat() if turn.submitted_at else "", turn.id)
