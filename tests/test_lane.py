"""The conversation lane: one active turn per conversation, FIFO; conversations run in parallel."""

from __future__ import annotations

import asyncio
import json
from itertools import pairwise
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

import turnkit
from tests.engine import Engine, busy_agent, eventually, held_tool, stored_pending_turn
from tests.history_scenarios import (
    ROLLOVER_EVENTS,
    activity_types,
    ends_at_completed_task,
    history_events,
    local_activities,
)
from tests.test_lost_completions import LocalAttemptFault
from turnkit._workflows.lane import ConversationWorkflow
from turnkit.kernel.payloads import LaneInput
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools

#: The lane itself: every turn goes through it, a fresh conversation's first too (the direct path: test_direct_turn.py).
pytestmark = pytest.mark.usefixtures("through_lanes")


@turnkit.tool(recovery="replay_safe")
async def pause_briefly(seconds: float) -> dict[str, Any]:
    """Take a little while (so that turns have measurable extent)."""
    await asyncio.sleep(seconds)
    return {"slept": seconds}


def slow_agent(name: str) -> turnkit.Agent:
    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        if any(m["role"] == "tool" for m in request.messages if m is request.messages[-1]):
            return turnkit.Result.build(text="done")
        return call_tools(("pause_briefly", {"seconds": 0.3}))

    return turnkit.Agent(name, model="scripted", tools=[pause_briefly], client=ScriptedClient(script))


async def test_turns_in_one_conversation_run_one_at_a_time_in_fifo_order(tk: TurnKit) -> None:
    conversation = await tk.conversation(slow_agent("lane"))
    first = await conversation.ask("first", wait=False)
    second = await conversation.ask("second", wait=False)
    third = await conversation.ask("third", wait=False)
    done = await asyncio.gather(*(turn.result(timeout=60) for turn in (first, second, third)))

    assert [t.status for t in done] == ["completed"] * 3
    spans = [(t.record.started_at, t.record.completed_at) for t in done]
    for (_, earlier_end), (later_start, _) in pairwise(spans):
        assert earlier_end is not None and later_start is not None
        assert earlier_end <= later_start, "a turn started before the previous one in its conversation ended"
    # Frozen snapshots: each turn saw its own trigger and everything before it, nothing after.
    sequences = [t.record.context_message_sequence for t in done]
    assert sequences == sorted(sequences)


async def test_turns_in_different_conversations_overlap(tk: TurnKit) -> None:
    a = await tk.conversation(slow_agent("left"))
    b = await tk.conversation(slow_agent("right"))
    left, right = await asyncio.gather(a.ask("go"), b.ask("go"))
    assert left.status == right.status == "completed"
    assert left.record.started_at and left.record.completed_at and right.record.started_at and right.record.completed_at
    assert left.record.started_at < right.record.completed_at
    assert right.record.started_at < left.record.completed_at


async def test_concurrent_asks_from_many_callers_all_run_once(tk: TurnKit) -> None:
    """T50 (SQLite and PostgreSQL): turns submitted concurrently to one conversation run one at a time (the lane
    replaces the gem's claim query): no two are ever running together, and each runs once."""
    client = ScriptedClient(lambda request: turnkit.Result.build(text="ok"))
    conversation = await tk.conversation(turnkit.Agent("many", model="scripted", client=client))
    turns = await asyncio.gather(*(conversation.ask(f"q{i}", wait=False) for i in range(12)))
    done = await asyncio.gather(*(t.result(timeout=60) for t in turns))
    assert [t.status for t in done] == ["completed"] * 12
    assert client.calls == 12
    records = sorted((t.record for t in done), key=lambda r: r.started_at or r.created_at)
    for earlier, later in pairwise(records):
        assert earlier.completed_at is not None and later.started_at is not None
        assert earlier.completed_at <= later.started_at
    messages = await conversation.messages()
    assert [m.sequence for m in messages] == list(range(1, 25))


async def test_a_turn_submitted_between_a_call_and_its_result_sees_no_unanswered_call(tk: TurnKit) -> None:
    """Turn b's frozen snapshot holds turn a's tool call but not its result: the call is left out of b's request
    (every call in a request has its result, behaviour §3.5), its text is kept."""
    release, hold = held_tool()
    client = ScriptedClient([call_tools(("hold", {}), text="let me check"), "a done", "b done"])
    conversation = await tk.conversation(turnkit.Agent("checker", model="scripted", tools=[hold], client=client))
    first = await conversation.ask("a", wait=False)

    async def calling() -> bool:
        return any(m.kind == "tool_call" for m in await conversation.messages())

    await eventually(calling, what="turn a's tool call to be stored")
    second = await conversation.ask("b", wait=False)
    release.set()
    assert (await first.result(timeout=60)).status == "completed"
    assert (await second.result(timeout=60)).status == "completed"
    request = client.requests[2].messages
    assert [m["role"] for m in request] == ["user", "assistant", "user"]
    assert request[1] == {"role": "assistant", "content": "let me check"}  # the call is dropped, its text kept


async def _holding(conversation: turnkit.Conversation) -> bool:
    """Whether the conversation's busy turn has proposed its tool call (it is in the tool now)."""
    return any(m.kind == "tool_call" for m in await conversation.messages())


async def test_a_queued_turn_cancelled_before_it_started_does_not_hold_up_the_next(tk: TurnKit) -> None:
    """Issue 9 (patches lane-starts-turns, lane-follows-on-demand): with turns queued, the lane waits for the busy
    turn's end signal; when it comes, the cancelled turn is found ended in the store and passed over, and the one
    after it runs at once, not after the lane's ``FOLLOW_POLL`` (1 min) check of the store."""
    release, agent = busy_agent("passes-over")
    conversation = await tk.conversation(agent)
    busy = await conversation.ask("busy", wait=False)
    await eventually(lambda: _holding(conversation), what="the busy turn's tool call")
    cancelled = await conversation.ask("never", wait=False)
    after = await conversation.ask("after", wait=False)
    assert (await cancelled.cancel()).status == "cancelled"
    release.set()
    assert (await busy.result(timeout=30)).status == "completed"
    done = await after.result(timeout=30)  # well under FOLLOW_POLL: no store check was needed
    assert (done.status, done.output_text) == ("completed", "answered after")
    assert (await cancelled.refresh()).status == "cancelled"


# -- store calls: one local attempt, then a regular activity when it fails -----------------------------------------


async def test_a_fresh_conversations_submit_and_turn_start_are_one_workflow_task(tk: TurnKit) -> None:
    """Issue 9 (patches local-store-calls, lane-starts-turns): the submit and the turn's start run as local
    activities, so the lane's first workflow task accepts the update, writes the turn and starts the turn's workflow
    (a workflow of its own, not a child); the turn's end signal lets the lane go on. No activity task is scheduled."""
    client = ScriptedClient(["hello"])
    conversation = await tk.conversation(turnkit.Agent("fast-lane", model="scripted", client=client))
    turn = await conversation.ask("hi")
    assert turn.status == "completed" and turn.output_text == "hello"
    events = await history_events(tk, conversation.id)
    assert activity_types(events)[:2] == ["turnkit.submit_turn", "turnkit.start_turn"]
    assert not [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    kinds = [e.event_type for e in events]
    assert EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED not in kinds
    tasks_before = {
        kind: kinds[:index].count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
        for index, kind in local_activities(events)
    }
    assert tasks_before == {"turnkit.submit_turn": 1, "turnkit.start_turn": 1}, "the turn started in a later task"
    started = (await tk.client.get_workflow_handle(turn.id).fetch_history()).events[0]
    assert not started.workflow_execution_started_event_attributes.HasField("parent_workflow_execution")


def _lane_signals(events: list[HistoryEvent]) -> list[str]:
    """The ``target_finished`` signals a lane's history received: the turn id each names."""
    return [
        json.loads(e.workflow_execution_signaled_event_attributes.input.payloads[0].data)
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        and e.workflow_execution_signaled_event_attributes.signal_name == "target_finished"
    ]


async def test_a_lane_hears_of_a_turns_end_only_when_it_has_more_to_run(tk: TurnKit) -> None:
    """Issue 9 (patch lane-follows-on-demand): a turn's end costs its lane nothing while nothing else waits (no
    signal, no timer, no workflow task); the next ask finds the end in the store without a wait row; a turn queued
    behind a running one registers the lane as its waiter, and the running turn's end signals the lane."""
    release, agent = busy_agent("on-demand")
    conversation = await tk.conversation(agent)
    first = await conversation.ask("one")
    assert first.output_text == "answered one"
    events = await history_events(tk, conversation.id)
    kinds = [e.event_type for e in events]
    assert ends_at_completed_task(events) and EventType.EVENT_TYPE_TIMER_STARTED not in kinds
    assert kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED) == 1, "the turn's end woke the lane"
    status = await tk.client.get_workflow_handle(conversation.id).query(ConversationWorkflow.status)
    assert status.active_turn_id == first.id  # the lane has not looked: its end was of no use to it yet

    second = await conversation.ask("two")  # the lane asks the store, which knows the first turn ended
    assert second.output_text == "answered two"
    events = await history_events(tk, conversation.id)
    assert activity_types(events).count("turnkit.follow_turn") == 1 and _lane_signals(events) == []
    assert await _waits_of(tk, conversation.id) == []  # an ended turn needs no waiter row

    busy = await conversation.ask("busy", wait=False)
    await eventually(lambda: _holding(conversation), what="the busy turn's tool call")
    queued = await conversation.ask("after", wait=False)  # more to run: the lane registers as the busy turn's waiter
    await eventually(lambda: _waits_on(tk, conversation.id, busy.id), what="the lane's wait row on the busy turn")
    release.set()
    assert (await queued.result(timeout=30)).output_text == "answered after"  # well under FOLLOW_POLL
    assert _lane_signals(await history_events(tk, conversation.id)) == [busy.id]


async def _waits_of(tk: TurnKit, waiter: str) -> list[str]:
    """The turns ``waiter`` (a turn or a lane: its conversation id) has wait rows on."""
    async with tk.store.atomic() as tx:
        return [w.target_turn_id for w in await tx.list_waits(turn_id=waiter)]


async def _waits_on(tk: TurnKit, waiter: str, target: str) -> bool:
    return await _waits_of(tk, waiter) == [target]


async def test_a_store_call_whose_local_attempt_fails_runs_again_as_an_activity(engine: Engine) -> None:
    """Issue 9: when the local attempt of ``turnkit.submit_turn`` fails (the store blinked), the lane runs it again as
    a regular activity with the store's retry policy; the turn completes, written once."""
    fault = LocalAttemptFault("turnkit.submit_turn", after_body=False)
    async with engine.tk.worker(interceptors=[fault]):
        client = ScriptedClient(["still here"])
        conversation = await engine.tk.conversation(turnkit.Agent("blink", model="scripted", client=client))
        turn = await conversation.ask("hi")
    assert turn.status == "completed" and turn.output_text == "still here"
    assert fault.failed == 1  # the one local attempt (LOCAL_RETRY) failed
    events = await history_events(engine.tk, conversation.id)
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled == ["turnkit.submit_turn"]
    assert [m.text for m in await conversation.messages() if m.role == "user"] == ["hi"]
    assert len(await conversation.turns()) == 1


# -- lost submissions and waiting on a queued turn -------------------------------------------------------------------


async def _answers(conversation: turnkit.Conversation) -> list[str]:
    """The conversation's model answers, in sequence order."""
    return [m.text or "" for m in await conversation.messages() if m.role == "assistant" and m.kind == "text"]


async def test_a_lost_submission_runs_before_the_turn_submitted_after_it(tk: TurnKit) -> None:
    """Issue 36 item 5: a submitted turn whose submission its lane lost (written to the store, unknown to the lane, as
    the local submit leaves it when caller, worker and server die together) while a turn runs: the next ``ask`` does
    not run ahead of it. Its submission names the lost turn (``TurnTicket.earlier``), the lane queues it first, and
    the answers come in submission order; ``turnkit check`` finds nothing, the order included."""
    since = utcnow()
    release, agent = busy_agent("in-order")
    conversation = await tk.conversation(agent)
    busy = await conversation.ask("busy", wait=False)
    await eventually(lambda: _holding(conversation), what="the busy turn's tool call")
    lost = await stored_pending_turn(tk, conversation.id, agent, "lost")
    after = await conversation.ask("after", wait=False)
    status = await tk.client.get_workflow_handle(conversation.id).query(ConversationWorkflow.status)
    assert status.queued_turn_ids == [lost.id, after.id]
    release.set()
    assert (await after.result(timeout=30)).status == "completed"
    assert (await tk.turn(lost.id).refresh()).status == "completed"
    assert await _answers(conversation) == ["answered busy", "answered lost", "answered after"]
    assert (await busy.refresh()).status == "completed"
    assert await tk.check(since=since, grace=0) == []


async def test_a_lost_submission_runs_before_the_turn_a_delivery_wakes(tk: TurnKit) -> None:
    """Issue 36 item 5: the same with a delivery to the idle lane: the wake's store call names the lost turn, the lane
    runs it before the woken turn."""
    _, agent = busy_agent("wakes-in-order")
    conversation = await tk.conversation(agent)
    assert (await conversation.ask("one")).status == "completed"
    lost = await stored_pending_turn(tk, conversation.id, agent, "lost")
    await conversation.post("note", key=f"note-{conversation.id}")

    async def both_answered() -> bool:
        return len(await _answers(conversation)) == 3

    await eventually(both_answered, what="the lost turn and the woken one to answer")
    assert await _answers(conversation) == ["answered one", "answered lost", "answered note"]
    assert (await tk.turn(lost.id).refresh()).status == "completed"


def _update_answers(events: list[HistoryEvent], name: str) -> list[str]:
    """The answers of the lane's ``name`` updates in a history, in order."""
    accepted = {
        e.workflow_execution_update_accepted_event_attributes.protocol_instance_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == name
    }
    return [
        json.loads(e.workflow_execution_update_completed_event_attributes.outcome.success.payloads[0].data)
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED
        and e.workflow_execution_update_completed_event_attributes.meta.update_id in accepted
    ]


async def test_waiting_for_a_queued_turn_waits_on_the_lane_not_the_store(tk: TurnKit, monkeypatch: Any) -> None:
    """Issue 36 item 7: ``Turn.result()`` of a turn queued behind a running one reads its record twice (when it finds
    no workflow, and once it has ended): it waits on the lane's ``turn_started`` update, which answers when the lane
    starts the turn, then on the turn's workflow. No polling of the store."""
    release, agent = busy_agent("no-polling")
    conversation = await tk.conversation(agent)
    await conversation.ask("busy", wait=False)
    await eventually(lambda: _holding(conversation), what="the busy turn's tool call")
    queued = await conversation.ask("after", wait=False)
    reads: list[str] = []
    load_turn = tk.store.load_turn

    async def counted(turn_id: str) -> Any:
        reads.append(turn_id)
        return await load_turn(turn_id)

    monkeypatch.setattr(tk.store, "load_turn", counted)
    waiting = asyncio.create_task(queued.result(timeout=30))

    async def asked() -> bool:
        events = await history_events(tk, conversation.id)
        return any(
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
            and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == "turn_started"
            for e in events
        )

    await eventually(asked, what="result() to ask the lane")
    assert not waiting.done()
    release.set()
    done = await waiting
    assert (done.status, done.output_text) == ("completed", "answered after")
    assert reads.count(queued.id) == 2, reads
    assert _update_answers(await history_events(tk, conversation.id), "turn_started") == ["started"]


async def test_a_lane_that_continues_as_new_sends_a_waiting_result_to_its_next_run(tk: TurnKit) -> None:
    """Issue 36 item 7: a lane past its history threshold continues as new while a turn runs and another waits in its
    queue; the ``turn_started`` update waiting for the queued one answers ``again`` (it must not hold the rollover),
    ``Turn.result()`` asks the new run, and returns when the turn has run."""
    release, agent = busy_agent("rolls-over")
    conversation = await tk.conversation(agent)
    lane = LaneInput(conversation_id=conversation.id, max_history_events=ROLLOVER_EVENTS)
    await tk.client.start_workflow(ConversationWorkflow.run, lane, id=conversation.id, task_queue=tk.task_queue)
    await conversation.ask("busy", wait=False)
    await eventually(lambda: _holding(conversation), what="the busy turn's tool call")
    queued = await conversation.ask("after", wait=False)
    waiting = asyncio.create_task(queued.result(timeout=60))
    asked_in: list[str] = []

    async def asked() -> bool:
        run_id = (await tk.client.get_workflow_handle(conversation.id).describe()).run_id or ""
        events = list((await tk.client.get_workflow_handle(conversation.id, run_id=run_id).fetch_history()).events)
        if any(
            e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
            and e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == "turn_started"
            for e in events
        ):
            asked_in.append(run_id)
        return bool(asked_in)

    await eventually(asked, what="result() to ask the lane")

    async def rolled_over() -> bool:
        latest = tk.client.get_workflow_handle(conversation.id)
        if (await latest.describe()).run_id != asked_in[0]:
            return True
        await latest.signal("wake")  # each signal is a workflow task that grows the history to its threshold
        return False

    await eventually(rolled_over, what="the lane to continue as new while a turn runs")
    release.set()
    done = await waiting
    assert (done.status, done.output_text) == ("completed", "answered after")
    old = tk.client.get_workflow_handle(conversation.id, run_id=asked_in[0])
    assert _update_answers(list((await old.fetch_history()).events), "turn_started") == ["again"]


async def test_waiting_for_a_lost_submission_submits_it_again(tk: TurnKit) -> None:
    """Issue 36 item 7: ``Turn.result()`` of a submitted turn that no workflow runs and no lane holds (its submission
    was lost) submits it to its lane again, once, and returns when it has run."""
    _, agent = busy_agent("waits-for-lost")
    conversation = await tk.conversation(agent)
    assert (await conversation.ask("one")).status == "completed"
    lost = await stored_pending_turn(tk, conversation.id, agent, "lost")
    done = await tk.turn(lost.id).result(timeout=30)
    assert (done.status, done.output_text) == ("completed", "answered lost")
