"""What happens after a turn's terminal write committed: its completion callback and its waiters are signalled."""

from __future__ import annotations

from temporalio import activity

from turnkit.deliveries import notify_completion, wake_lane
from turnkit.records import TurnRecord
from turnkit.store.store import Store
from turnkit.waits import notify_waiters

__all__ = ["announce_terminal"]


async def announce_terminal(store: Store, turn: TurnRecord) -> None:
    """Signal the callback conversation, every waiting turn and, for a sub-agent's turn, its conversation's lane
    (idempotent; retried with the activity)."""
    client = activity.client()
    await notify_completion(store, client, activity.info().task_queue, turn.id)
    await notify_waiters(store, client, turn.id)
    await wake_lane(client, turn)  # needs only ids and lineage, which never change
