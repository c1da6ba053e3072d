"""A turn runs without the conversation's lane when there is nothing to order: a fresh conversation's first (issue
9), or the next turn of an idle conversation (issue 37 target 3; :mod:`turnkit._engine.direct_turn`).

What must hold: ``ask`` starts such a turn itself (no lane workflow, no staged input); a turn asked while another
is unfinished, a delivery or a concurrent ``ask`` goes through the lane, which runs the direct turn first and
follows it to its end, so a conversation never has two active turns; a direct turn whose client died between its
commit and its start is started by the lane.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy import text

import turnkit
from tests.engine import busy_agent, eventually, lane_exists
from turnkit._engine import dispatch, turn_build
from turnkit._engine.direct_turn import write_direct_turn
from turnkit._engine.ids import new_id
from turnkit._workflows.lane import ConversationWorkflow
from turnkit.config import configure, settings
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.payloads import ModelPolicy, SubmitTurn
from turnkit.kernel.records import TurnRecord
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient


async def _direct(tk: TurnKit, turn_id: str) -> bool:
    """Whether the store marks ``turn_id`` as started without its lane."""
    async with tk.store.atomic() as tx:
        row = await tx.connection.execute(text("SELECT direct FROM turnkit_turns WHERE uid = :uid"), {"uid": turn_id})
        return bool(row.scalar_one())


async def _in_tool(conversation: turnkit.Conversation) -> bool:
    return any(m.kind == "tool_call" for m in await conversation.messages())


def _one_after_the_other(first: TurnRecord, second: TurnRecord) -> None:
    assert first.completed_at is not None and second.started_at is not None
    assert second.started_at >= first.completed_at, f"{second.id} started while {first.id} ran"


async def test_a_fresh_conversations_first_turn_runs_without_a_lane(tk: TurnKit) -> None:
    """Issue 9: the first ``ask`` writes the message and the turn (marked direct, no staged input) and starts the
    turn's workflow itself; no lane workflow exists. Issue 37 target 3: so does the second, asked after the first
    ended; with ``direct_idle_turns=False`` the third goes through the lane."""
    agent = turnkit.Agent("direct", model="scripted", client=ScriptedClient(["a", "b", "c"]))
    conversation = await tk.conversation(agent)
    first = await conversation.ask("one")
    assert first.status == "completed" and first.output_text == "a"
    assert await _direct(tk, first.id)
    assert not await lane_exists(tk, conversation.id)
    async with tk.store.atomic() as tx:
        with pytest.raises(RecordNotFound):  # the content went straight into the message
            await tx.load_staged_input(first.record.options.trigger_message_id or "")
    second = await conversation.ask("two")
    assert second.output_text == "b" and await _direct(tk, second.id)
    assert second.record.context_message_sequence == 3  # it sees the first turn's messages and its own
    assert not await lane_exists(tk, conversation.id)
    configure(direct_idle_turns=False)
    third = await conversation.ask("three")
    assert third.output_text == "c" and not await _direct(tk, third.id)
    assert await lane_exists(tk, conversation.id)
    assert [m.text for m in await conversation.messages()] == ["one", "a", "two", "b", "three", "c"]


async def test_an_idle_conversations_next_turn_skips_the_lane_that_ran_its_earlier_ones(tk: TurnKit) -> None:
    """Issue 37 target 3: a conversation alternates direct and lane turns and never has two active. A turn asked
    while the direct first one runs goes through the lane; once both ended, the next ``ask`` is direct again, and
    the lane, which ran a turn before, follows that direct turn before it runs one more asked meanwhile."""
    release, agent = busy_agent("direct-idle")
    conversation = await tk.conversation(agent)
    busy = await conversation.ask("busy", wait=False)
    await eventually(lambda: _in_tool(conversation), what="the direct turn's tool call")
    after = await conversation.ask("after", wait=False)
    release.set()
    assert (await after.result(timeout=30)).output_text == "answered after"
    release.clear()

    again = await conversation.ask("busy", wait=False)

    async def in_second_tool() -> bool:
        return [m.kind for m in await conversation.messages()].count("tool_call") == 2

    await eventually(in_second_tool, what="the idle conversation's direct turn in its tool")
    last = await conversation.ask("last", wait=False)
    lane = tk.client.get_workflow_handle(conversation.id)

    async def lane_follows_again() -> bool:
        status = await lane.query(ConversationWorkflow.status)
        return status.active_turn_id == again.id and status.queued_turn_ids == [last.id]

    await eventually(lane_follows_again, what="the lane running the direct turn first")
    assert (await last.refresh()).status == "pending"
    release.set()
    done = await last.result(timeout=30)
    assert done.output_text == "answered last"
    _one_after_the_other((await again.result(timeout=30)).record, done.record)
    assert [await _direct(tk, t.id) for t in (busy, after, again, last)] == [True, False, True, False]


async def test_a_turn_asked_while_the_direct_first_turn_runs_waits_for_it(tk: TurnKit) -> None:
    """Issue 9 (one active turn per conversation): the lane meets the running direct turn in the submit's
    transaction, runs it first (its start a no-op) and follows it; the second turn starts after the first ended."""
    release, agent = busy_agent("direct-busy")
    conversation = await tk.conversation(agent)
    busy = await conversation.ask("busy", wait=False)
    await eventually(lambda: _in_tool(conversation), what="the direct turn's tool call")
    after = await conversation.ask("after", wait=False)
    lane = tk.client.get_workflow_handle(conversation.id)

    async def lane_follows_busy() -> bool:
        status = await lane.query(ConversationWorkflow.status)
        return status.active_turn_id == busy.id and status.queued_turn_ids == [after.id]

    await eventually(lane_follows_busy, what="the lane running the direct turn first")
    assert (await after.refresh()).status == "pending"
    release.set()
    done = await after.result(timeout=30)
    assert done.output_text == "answered after"
    _one_after_the_other((await busy.refresh()).record, done.record)


async def test_a_delivery_to_a_conversation_whose_direct_turn_runs_goes_in_after_it(tk: TurnKit) -> None:
    """Issue 9, behaviour §5.11: a delivery's signal starts the lane while the direct first turn runs; the lane
    follows that turn, then appends the delivery and wakes a turn for it, after the first turn's messages."""
    release, agent = busy_agent("direct-post")
    conversation = await tk.conversation(agent)
    busy = await conversation.ask("busy", wait=False)
    await eventually(lambda: _in_tool(conversation), what="the direct turn's tool call")
    await conversation.post("later", key="later-1")
    lane = tk.client.get_workflow_handle(conversation.id)

    async def lane_follows_busy() -> bool:
        return (await lane.query(ConversationWorkflow.status)).active_turn_id == busy.id

    await eventually(lane_follows_busy, what="the lane following the direct turn")
    assert [m.text for m in await conversation.messages() if m.role == "user"] == ["busy"]
    release.set()
    first = (await busy.result(timeout=30)).record

    async def woken() -> list[TurnRecord]:
        return [t for t in await tk.store.list_turns(conversation_id=conversation.id) if t.id != busy.id]

    async def woken_ended() -> bool:
        turns = await woken()
        return len(turns) == 1 and turns[0].terminal

    await eventually(woken_ended, what="the woken turn's end")
    [turn] = await woken()
    assert turn.status == "completed" and turn.output_text == "answered later"
    _one_after_the_other(first, turn)
    assert [m.text for m in await conversation.messages()][-2:] == ["later", "answered later"]


async def test_a_direct_turn_whose_client_died_before_its_start_is_started_by_the_lane(tk: TurnKit) -> None:
    """Issue 9, fault: the direct turn committed but its client died before starting its workflow; the
    conversation's next ``ask`` makes the lane start it first (then the new turn), so nothing is orphaned."""
    conversation = await tk.conversation(turnkit.Agent("orphan", model="scripted", client=ScriptedClient(["a", "b"])))
    request = SubmitTurn(
        conversation_id=conversation.id, turn_id=new_id("turn"), message_id=new_id("message"), text="one"
    )
    assert await write_direct_turn(tk.store, request, conversation.agent_name) is not None  # and no start
    second = await conversation.ask("two")
    orphan = await tk.store.load_turn(request.turn_id)
    assert orphan.status == "completed" and orphan.output_text == "a"
    assert second.output_text == "b"
    _one_after_the_other(orphan, second.record)


async def test_concurrent_first_asks_run_one_after_the_other(tk: TurnKit) -> None:
    """Issue 9 (race): two ``ask`` calls on a fresh conversation at once; the conversation's row lock lets one be
    its direct first turn and sends the other through the lane, which runs it after the first."""
    conversation = await tk.conversation(turnkit.Agent("race", model="scripted", client=ScriptedClient(["x", "y"])))
    one, two = await asyncio.gather(conversation.ask("one"), conversation.ask("two"))
    assert {one.status, two.status} == {"completed"}
    direct = [await _direct(tk, t.id) for t in (one, two)]
    assert sorted(direct) == [False, True]
    first, second = (one, two) if direct[0] else (two, one)
    _one_after_the_other(first.record, second.record)


@pytest.mark.parametrize("how", ["paused", "wait_for", "setting"])
async def test_turns_that_need_the_lane_go_through_it_even_when_first(
    tk: TurnKit, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 9: a paused first turn (it waits in its lane for a resume), one with ``wait_for`` (its edges take the
    store's wait-graph lock in the lane's submit) and any with ``direct_first_turns=False`` go through the lane."""
    agent = turnkit.Agent(f"lane-{how}", model="scripted", client=ScriptedClient(["done", "done"]))
    if how == "setting":
        configure(direct_first_turns=False)
    other = await tk.conversation(agent)
    target = await other.ask("target") if how == "wait_for" else None
    conversation = await tk.conversation(agent)
    turn = await conversation.ask(
        "hi", paused=how == "paused", wait_for=[target] if target is not None else None, wait=how != "paused"
    )
    if how == "paused":
        await turn.resume()
        turn = await turn.result(timeout=30)
    assert turn.status == "completed"
    assert not await _direct(tk, turn.id) and await lane_exists(tk, conversation.id)


async def test_a_direct_turn_whose_workflow_was_terminated_is_failed_by_the_lane_before_the_next(tk: TurnKit) -> None:
    """Issue 9, fault (an operator terminated the running direct turn's workflow): the record still says running;
    the conversation's next ``ask`` makes the lane follow that turn, find its workflow closed, record it failed, and
    only then run the new turn."""
    release, agent = busy_agent("direct-terminated")
    conversation = await tk.conversation(agent)
    busy = await conversation.ask("busy", wait=False)
    await eventually(lambda: _in_tool(conversation), what="the direct turn's tool call")
    await tk.client.get_workflow_handle(busy.id).terminate("test: an operator ends it")
    after = await conversation.ask("after")
    assert after.output_text == "answered after"
    lost = (await busy.refresh()).record
    assert lost.status == "failed" and lost.error == {"class": "TurnKit::Error", "message": "turn workflow terminated"}
    _one_after_the_other(lost, after.record)
    release.set()  # the zombie tool body ends: fenced, it writes nothing


async def test_a_first_turn_takes_its_model_call_settings_from_the_process_that_asks(
    tk: TurnKit, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 9 (found by the chaos suite): ``ask`` resolves a direct turn's model-call policy from its own settings,
    and a worker whose settings differ says so, once, naming both values; the turn still runs."""
    asked = ModelPolicy(timeout=settings.model_timeout, heartbeat=7.0, max_attempts=settings.model_max_attempts)
    monkeypatch.setattr(turn_build, "model_policy", lambda: asked)  # the asking process, configured otherwise
    monkeypatch.setattr(dispatch, "_reported", set())
    conversation = await tk.conversation(turnkit.Agent("drift", model="scripted", client=ScriptedClient(["a", "b"])))
    with caplog.at_level(logging.WARNING, logger="turnkit._engine.dispatch"):
        first = await conversation.ask("one")
        second = await conversation.ask("two")  # the same difference: not logged again
    assert (first.status, second.status) == ("completed", "completed")
    history = await tk.client.get_workflow_handle(first.id).fetch_history()
    [scheduled] = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled.heartbeat_timeout.ToTimedelta().total_seconds() == 7.0
    warnings = [r.getMessage() for r in caplog.records if r.name == "turnkit._engine.dispatch"]
    assert len(warnings) == 1, warnings
    assert "model_heartbeat_timeout=7" in warnings[0] and "model_heartbeat_timeout=30" in warnings[0]
