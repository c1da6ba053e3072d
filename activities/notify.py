"""What happens after a turn's terminal write committed: its completion callback and its waiters are signalled."""

from __future__ import annotations

from temporalio import activity

from turnkit._engine.turn_end import announce_end
from turnkit.kernel.records import TurnRecord
from turnkit.store.store import Store

__all__ = ["announce_terminal"]


async def announce_terminal(store: Store, turn: TurnRecord) -> None:
    """Signal the callback conversation, every waiting turn and, for a sub-agent's turn, its conversation's lane
    (idempotent; retried with the activity). One store transaction reads what to signal (:func:`announce_end`)."""
    await announce_end(store, activity.client(), activity.info().task_queue, turn)
