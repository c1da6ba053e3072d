"""The single-active-turn invariant of a conversation (issue 8 item 7): a lane held for a sub-agent's turn stays held
whatever signals arrive; a nudge (``deliver``, ``turnkit reconcile``) makes it re-check the store, never skip it."""

from __future__ import annotations

from itertools import pairwise

from temporalio.api.enums.v1 import EventType

from tests.engine import busy_sub_agent, eventually, lane_buffers
from tests.history_scenarios import ends_at_completed_task
from turnkit.kernel.payloads import LaneStatus
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow

_SIGNALED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED


async def lane_quiet(tk: TurnKit, conversation_id: str, signals: int) -> bool:
    """The lane received ``signals`` signals and handled them: its history ends at a completed workflow task and no
    activity it scheduled is still open (the store re-check, if any, has answered)."""
    events = list((await tk.client.get_workflow_handle(conversation_id).fetch_history()).events)
    kinds = [e.event_type for e in events]
    scheduled = kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    closed = kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED) + kinds.count(
        EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
    )
    return kinds.count(_SIGNALED) >= signals and ends_at_completed_task(events) and scheduled == closed


async def test_a_delivery_and_reconcile_do_not_release_a_lane_held_for_a_sub_agent(tk: TurnKit) -> None:
    """Issue 8 item 7: a sub-agent's turn runs in its child conversation and an ask there is held; a delivery and
    `turnkit reconcile` then nudge the lane: no second turn runs until the sub-agent's turn ends, then the held turn
    and the delivered input run, one at a time."""
    since = utcnow()
    busy = await busy_sub_agent(tk)
    turn, record, child_conversation, release = busy.turn, busy.child, busy.conversation, busy.release
    asked = await child_conversation.ask("also this", wait=False)  # starts the lane: held, a sub-agent turn runs

    async def held() -> bool:
        lane = await tk.client.get_workflow_handle(record.conversation_id).query("status", result_type=LaneStatus)
        return lane.queued_turn_ids == [asked.id] and lane.active_turn_id is None

    await eventually(held, what="the asked turn to be held in the lane")
    posted = await child_conversation.post("and then this", key=f"nudge-{record.id}")  # signal 1: deliver
    await eventually(lambda: lane_buffers(tk, record.conversation_id, posted.id), what="the lane to hold the post")
    assert posted.id in {d.id for d in await tk.reconcile(since=since)}  # signal 2: deliver again
    await eventually(lambda: lane_quiet(tk, record.conversation_id, 2), what="the lane to handle both nudges")

    assert await held(), "a nudge released the hold"
    assert [t.status for t in await child_conversation.turns()] == ["running", "pending"]  # one active turn
    release.set()
    assert (await turn.result(timeout=60)).status == "completed"
    done = await asked.result(timeout=60)
    assert done.status == "completed" and done.output_text == "child saw also this"

    async def all_done() -> bool:
        turns = await child_conversation.turns()
        return len(turns) == 3 and all(t.record.terminal for t in turns)

    await eventually(all_done, what="the delivered input to wake a third turn")
    records = [t.record for t in await child_conversation.turns()]
    assert [r.output_text for r in records] == ["child saw {}", "child saw also this", "child saw and then this"]
    for earlier, later in pairwise(records):
        assert earlier.completed_at is not None and later.started_at is not None
        assert earlier.completed_at <= later.started_at, "two turns of one conversation overlapped"
