"""Activities the conversation lane uses to keep one turn at a time (issue 8 items 5 and 7).

* ``turnkit.lane_held``: is a sub-agent's turn (run by its parent, not by the lane) still active here? A nudge
  (``deliver``, ``wake``) makes a held lane ask the store again, never release blindly.
* ``turnkit.end_turn``: a turn workflow the lane ran ended abnormally (terminated, timed out, failed): record it
  ``failed`` unless its record is terminal already.
* ``turnkit.follow_turn``: after the lane continued as new while a turn ran, wait (heartbeating, retried) until that
  turn's workflow closes, then do what ``end_turn`` does if it closed without a terminal record.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from activities.heartbeat import heartbeating
from turnkit.deliveries import sub_agent_turn_active
from turnkit.payloads import EndTurn, TurnOutcome
from turnkit.store.store import Store
from turnkit.turn_end import ended_reason, fail_unfinished_turn

__all__ = ["LaneActivities"]


class LaneActivities:
    """Lane activities bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @activity.defn(name="turnkit.lane_held")
    async def lane_held(self, conversation_id: str) -> bool:
        """Whether a sub-agent's turn is still active in the conversation (the lane keeps holding its queue)."""
        async with self.store.atomic() as tx:
            return await sub_agent_turn_active(tx, conversation_id)

    @activity.defn(name="turnkit.end_turn")
    async def end_turn(self, end: EndTurn) -> TurnOutcome:
        """Record a turn whose workflow ended abnormally ``failed`` (a no-op on a terminal record)."""
        turn = await fail_unfinished_turn(
            self.store, activity.client(), activity.info().task_queue, end.turn_id, end.reason
        )
        return _outcome(turn.id, turn.status, turn.error)

    @activity.defn(name="turnkit.follow_turn")
    async def follow_turn(self, end: EndTurn) -> TurnOutcome:
        """Wait for a turn's workflow (through its continue-as-new runs) to close; record a missing terminal status."""
        client = activity.client()
        reason = end.reason
        async with heartbeating():
            try:
                await client.get_workflow_handle(end.turn_id).result()
            except WorkflowFailureError as err:
                reason = ended_reason(err.cause)
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise  # the server is away: retried
                reason = "turn workflow not found"
        turn = await self.store.load_turn(end.turn_id)
        if not turn.terminal:
            turn = await fail_unfinished_turn(self.store, client, activity.info().task_queue, end.turn_id, reason)
        return _outcome(turn.id, turn.status, turn.error)


def _outcome(turn_id: str, status: str, error: dict[str, str] | None) -> TurnOutcome:
    error = error or {}
    return TurnOutcome(
        turn_id=turn_id,
        status=status if status in ("completed", "failed", "cancelled") else "failed",  # type: ignore[arg-type]
        error_class=error.get("class"),
        error_message=error.get("message"),
    )
