"""Activities the conversation lane uses to keep one turn at a time (issue 8 items 5 and 7).

* ``turnkit.lane_held``: is a sub-agent's turn (run by its parent, not by the lane) still active here? A nudge
  (``deliver``, ``wake``) makes a held lane ask the store again, never release blindly.
* ``turnkit.end_turn``: a turn workflow the lane ran ended abnormally (terminated, timed out, failed): record it
  ``failed`` unless its record is terminal already.
* ``turnkit.start_turn``: start the lane's next turn as a workflow of its own (patch ``lane-starts-turns``), eagerly:
  the start's reply hands the turn's first workflow task to this worker, so no task of the server's rate-limited
  queues lies between the submit and the turn's first model call (docs/design.md, "Queue and start").
* ``turnkit.follow_turn``: has that turn ended? If not, registers the lane as a waiter of the turn (its end signals
  the lane), and does what ``end_turn`` does if the turn's workflow closed without a terminal record. The lane asks
  it when more work arrives while a turn runs (patch ``lane-follows-on-demand``), when no end signal came for a
  while, and after it continued as new while a turn ran.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from turnkit._engine.turn_end import fail_unfinished_turn
from turnkit._engine.turn_start import start_turn_workflow
from turnkit.kernel.activities import LaneCalls, implements
from turnkit.kernel.payloads import EndTurn, StartTurn, TurnOutcome
from turnkit.kernel.records import TERMINAL_TURN_STATUSES
from turnkit.store.store import Store

__all__ = ["LaneActivities"]


class LaneActivities(LaneCalls):
    """Lane activities bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @implements(LaneCalls.lane_held)
    async def lane_held(self, conversation_id: str) -> bool:
        """Whether a turn the lane does not run is still active in the conversation (the lane keeps holding its
        queue): a sub-agent's, or the direct turn that an older lane run holds for instead of following it."""
        async with self.store.atomic() as tx:
            outside = await tx.turns_outside_lane(conversation_id)
        return outside.sub_agent or outside.direct is not None

    @implements(LaneCalls.start_turn)
    async def start_turn(self, start: StartTurn) -> bool:
        """Start the turn's workflow (workflow id = turn id) on the lane's task queue; True if this call started it.

        Idempotent: a retried call (a local attempt that ran again, a workflow task retried after a crash) finds the
        workflow, running or closed, and starts nothing (``REJECT_DUPLICATE``: a turn never runs twice). Nothing is
        written here: the lane asks for the turn's end when it needs it (``turnkit.follow_turn``).
        """
        client, task_queue = activity.client(), activity.info().task_queue
        return await start_turn_workflow(client, task_queue, start.turn, search_attributes=start.search_attributes)

    @implements(LaneCalls.end_turn)
    async def end_turn(self, end: EndTurn) -> TurnOutcome:
        """Record a turn whose workflow ended abnormally ``failed`` (a no-op on a terminal record)."""
        turn, _ = await fail_unfinished_turn(
            self.store, activity.client(), activity.info().task_queue, end.turn_id, end.reason
        )
        return _outcome(turn.id, turn.status, turn.error)

    @implements(LaneCalls.follow_turn)
    async def follow_turn(self, end: EndTurn) -> bool:
        """Whether the lane's turn has ended; if not, the lane waits for its end signal from now on.

        A terminal record is final: then nothing is written (the usual case when a conversation's next turn arrives
        after the previous one ended). Otherwise the lane registers as a waiter of the turn: a wait row whose waiter
        is the conversation id (the lane's workflow id), so the turn's end signals the lane (``target_finished``)
        as it signals waiting turns. The record is read again after the row committed, so no end is missed (see
        :mod:`turnkit._engine.waits`). A turn workflow that closed without a terminal record is recorded ``failed`` here
        (nothing else would signal that).
        """
        turn = await self.store.load_turn(end.turn_id)
        if turn.terminal:
            return True
        async with self.store.atomic() as tx:
            await tx.create_wait(turn_id=turn.conversation_id, target_turn_id=turn.id)
        turn = await self.store.load_turn(end.turn_id)
        if turn.terminal:
            return True
        client = activity.client()
        try:
            status = (await client.get_workflow_handle(turn.id).describe()).status
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise  # the server is away: retried
            reason = "turn workflow not found"
        else:
            if status in (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW):
                return False
            reason = _CLOSED.get(status, end.reason)
        await fail_unfinished_turn(self.store, client, activity.info().task_queue, turn.id, reason)
        return True


#: How a closed turn workflow ended, for the error message of its record.
_CLOSED = {
    WorkflowExecutionStatus.TERMINATED: "turn workflow terminated",
    WorkflowExecutionStatus.TIMED_OUT: "turn workflow timed out",
    WorkflowExecutionStatus.FAILED: "turn workflow failed",
    WorkflowExecutionStatus.CANCELED: "turn workflow cancelled",
}


def _outcome(turn_id: str, status: str, error: dict[str, str] | None) -> TurnOutcome:
    error = error or {}
    return TurnOutcome(
        turn_id=turn_id,
        status=status if status in TERMINAL_TURN_STATUSES else "failed",  # type: ignore[arg-type]
        error_class=error.get("class"),
        error_message=error.get("message"),
    )
