"""Durable messaging on a real Temporal dev server and real databases: deliveries arrive as signals."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

import turnkit
from tests.engine import busy_sub_agent, eventually, held_tool, lane_buffers
from tests.history_scenarios import history_events, local_activity_types, scheduled_activities
from turnkit._engine.builtin_tools import send_message
from turnkit.kernel.payloads import LaneStatus
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools


def echo_agent(name: str = "echo", **options: Any) -> tuple[turnkit.Agent, ScriptedClient]:
    client = ScriptedClient(lambda request: turnkit.Result.build(text=f"seen {len(request.messages)}"))
    return turnkit.Agent(name, model="scripted", client=client, **options), client


async def turns_of(conversation: turnkit.Conversation) -> list[turnkit.Turn]:
    return [await t.refresh() for t in await conversation.turns()]


async def all_finished(conversation: turnkit.Conversation, count: int) -> bool:
    turns = await conversation.turns()
    return len(turns) >= count and all(t.record.terminal for t in turns)


async def test_post_wakes_an_idle_conversation_with_the_destination_principal(tk: TurnKit) -> None:
    """T78: a conversation of principal "executor" gets a post from principal "sender": its tools see
    ``context.principal == "executor"``, the delivered message's metadata principal is "sender", a duplicate post
    returns the same delivery, and the same key with another principal raises ``ToolError``."""
    seen: list[Any] = []

    async def whoami(context: turnkit.ToolContext) -> dict[str, Any]:
        """Report who this turn acts for."""
        seen.append(context.principal)
        return {"principal": context.principal}

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        if request.messages[-1]["role"] == "tool":
            return turnkit.Result.build(text="done")
        return call_tools(("whoami", {}))

    client = ScriptedClient(script)
    agent = turnkit.Agent("echo", model="scripted", client=client, tools=[turnkit.tool(whoami)])
    conversation = await tk.conversation(agent, principal="executor")
    delivery = await conversation.post("hello there", key="k-1", principal="sender")
    assert delivery.payload == {"text": "hello there", "principal": "sender"}
    await eventually(lambda: all_finished(conversation, 1), what="a woken turn to finish")

    [turn] = await turns_of(conversation)
    assert turn.status == "completed"
    assert turn.record.options.principal == "executor"  # never the sender's (behaviour §7.2)
    [message] = [m for m in await conversation.messages() if m.metadata.get("delivery_id")]
    assert message.text == "hello there" and message.metadata["principal"] == "sender"
    assert turn.record.options.trigger_message_id == message.id
    [stored] = await conversation.inbox()
    assert stored.delivered_at is not None and stored.message_id == message.id
    status = await conversation.input_status(delivery.id)
    assert status["status"] == "applied" and status["application"]["turn_id"] == turn.id
    assert seen == ["executor"], "T78: tools act for the destination's principal, never the sender's"
    assert client.calls == 2

    # A same-key retry returns the original and appends nothing; a changed payload is refused.
    again = await conversation.post("hello there", key="k-1", principal="sender")
    assert again.id == delivery.id
    with pytest.raises(turnkit.ToolError, match="delivery key is already used for a different message"):
        await conversation.post("hello there", key="k-1", principal="someone else")
    assert len(await conversation.inbox()) == 1


async def test_delivery_to_a_busy_conversation_is_consumed_by_a_later_turn(tk: TurnKit) -> None:
    """T71: the same key sent (and signalled) twice to a conversation whose turn runs is one delivery, held: the
    running turn never sees it; once it completes, a second turn's request includes it, outbox = inbox = 1, and
    the delivery has ``delivered_at``."""
    release, hold = held_tool()

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        if request.messages[-1]["role"] == "user" and request.messages[-1]["content"] == "start":
            return call_tools(("hold", {}))
        return turnkit.Result.build(text="ok")

    client = ScriptedClient(script)
    destination = await tk.conversation(turnkit.Agent("busy", model="scripted", tools=[hold], client=client))
    source = await tk.conversation(echo_agent("sender")[0])
    first = await destination.ask("start", wait=False)
    await eventually(lambda: _running(first), what="the first turn to run")

    delivery = await source.send_message(destination, "while you were busy", key="busy-1")
    again = await source.send_message(destination, "while you were busy", key="busy-1")  # retried: same delivery
    assert again.id == delivery.id
    await eventually(lambda: lane_buffers(tk, destination.id, delivery.id), what="the lane to hold the delivery")
    assert len(await destination.turns()) == 1  # busy: no turn starts
    status = await destination.input_status(delivery.id)
    assert status["status"] == "pending" and status["delivered_at"] is None  # appended once the lane is idle

    release.set()
    await eventually(lambda: all_finished(destination, 2), what="the woken second turn")
    first_turn, second_turn = await turns_of(destination)
    assert first_turn.status == second_turn.status == "completed"
    texts = [[m["content"] for m in r.messages] for r in client.requests]
    assert not any("while you were busy" in t for t in texts[0] + texts[1])  # the running turn never saw it
    assert texts[-1][-1] == "while you were busy"  # after the first turn's answer: the new input comes last
    assert (await destination.input_status(delivery.id))["application"]["turn_id"] == second_turn.id
    assert len(await source.outbox()) == 1 and len(await destination.inbox()) == 1
    [stored] = await destination.inbox()
    assert stored.delivered_at is not None


async def test_completion_callback_delivers_the_result(tk: TurnKit) -> None:
    worker_agent, _ = echo_agent("worker_agent")
    boss_agent, boss_client = echo_agent("boss")
    boss = await tk.conversation(boss_agent)
    job = await tk.conversation(worker_agent)
    turn = await job.ask("do the job", callback=boss)
    assert turn.status == "completed"
    await eventually(lambda: all_finished(boss, 1), what="the callback to wake the boss")
    [delivery] = await boss.inbox()
    assert delivery.key == f"completion:{turn.id}" and delivery.source_turn_id == turn.id
    payload = json.loads(delivery.payload["text"])
    assert payload == {"conversation_id": job.id, "turn_id": turn.id, "status": "completed", "result": "seen 1"}
    assert boss_client.calls == 1


async def test_send_message_tool(tk: TurnKit) -> None:
    """The built-in ``send_message`` delivers once and wakes the idle listener; the call runs as a local activity
    inside the talker turn's workflow task (``SendMessageTool.local``), not as an activity task of its own."""
    listener, listener_client = echo_agent("listener")
    inbox = await tk.conversation(listener)
    client = ScriptedClient([call_tools(("send_message", {"conversation_id": inbox.id, "text": "ping"})), "sent"])
    talker = await tk.conversation(turnkit.Agent("talker", model="scripted", tools=[send_message], client=client))
    turn = await talker.ask("tell them")
    assert turn.status == "completed"
    [execution] = await turn.tool_executions()
    assert execution.status == "completed" and execution.result is not None
    assert execution.result["key"] == f"message:{execution.id}"
    await eventually(lambda: all_finished(inbox, 1), what="the listener to be woken")
    assert listener_client.calls == 1
    [message] = [m for m in await inbox.messages() if m.metadata.get("delivery_id")]
    assert message.text == "ping" and message.metadata["source_turn_id"] == turn.id
    events = await history_events(tk, turn.id)
    assert "tool:send_message" in local_activity_types(events)
    assert "tool:send_message" not in scheduled_activities(events)


async def test_delivery_to_a_missing_conversation_writes_nothing(tk: TurnKit) -> None:
    agent, _ = echo_agent()
    conversation = await tk.conversation(agent)
    with pytest.raises(turnkit.RecordNotFound, match="destination conversation not found"):
        await conversation.send_message("conv_000000000000000000000000", "hi", key="nowhere")
    assert await conversation.outbox() == []


async def test_reconcile_repairs_a_lost_signal(tk: TurnKit) -> None:
    """A delivery committed without its signal is re-signalled by ``reconcile`` (scoped to what this test made) and
    wakes one turn; reconciling again finds it applied and appends nothing twice."""
    since = utcnow()
    agent, client = echo_agent()
    conversation = await tk.conversation(agent)
    async with tk.store.atomic() as tx:  # a delivery committed, but its signal never sent
        lost, _ = await tx.create_delivery(
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key="lost-signal",
            payload={"text": "did you get this?"},
        )
    assert lost.id in {d.id for d in await tk.reconcile(since=since)}
    await eventually(lambda: all_finished(conversation, 1), what="the reconciled delivery to wake a turn")
    assert lost.id not in {d.id for d in await tk.reconcile(since=since)}  # applied: no longer pending
    await tk.reconcile(since=since)
    messages = [m for m in await conversation.messages() if m.metadata.get("delivery_id")]
    assert len(messages) == 1 and client.calls == 1


async def test_messages_after_hides_thinking_and_provider_parts(tk: TurnKit) -> None:
    """T90: ``messages_after`` the previous sequence returns only the message with thinking, text and provider parts,
    as ``[text "public"]``; after its own sequence nothing; the stored message keeps its 3 parts."""
    agent, _ = echo_agent()
    conversation = await tk.conversation(agent)
    first = await conversation.say("before")
    await tk.store.append_message(
        conversation.id,
        role="assistant",
        content=[
            {"type": "thinking", "text": "secret", "signature": "s", "redacted": False},
            {"type": "text", "text": "public"},
            {"type": "provider", "kind": "anthropic", "data": {"x": 1}},
        ],
    )
    [shown] = await conversation.messages_after(first.sequence)
    assert shown.content == [{"type": "text", "text": "public"}]
    assert await conversation.messages_after(shown.sequence) == []
    stored = (await conversation.messages())[-1]
    assert len(stored.content) == 3


async def _running(turn: turnkit.Turn) -> bool:
    return (await turn.refresh()).status == "running"


async def test_reconcile_command(tk: TurnKit, engine: Any) -> None:
    agent, client = echo_agent()
    conversation = await tk.conversation(agent)
    async with tk.store.atomic() as tx:
        await tx.create_delivery(
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key="lost-for-the-cli",
            payload={"text": "via the command"},
        )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turnkit.cli",
        "reconcile",
        "--address",
        engine.temporal_address,
        "--database-url",
        engine.database_url,
        "--task-queue",
        tk.task_queue,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    assert process.returncode == 0 and b"re-signalled " in out, out
    await eventually(lambda: all_finished(conversation, 1), what="the delivery re-signalled by the command")
    assert client.calls == 1


async def test_input_for_a_sub_agent_conversation_waits_for_its_running_turn(tk: TurnKit) -> None:
    """A sub-agent's turn is run by its parent, not by its conversation's lane: the lane still keeps one turn at a
    time, and the input lands after the sub-agent's messages."""
    busy = await busy_sub_agent(tk)
    turn, record, child_conversation, release = busy.turn, busy.child, busy.conversation, busy.release
    posted = await child_conversation.post("and then this", key=f"more-{record.id}")
    await eventually(lambda: lane_buffers(tk, record.conversation_id, posted.id), what="the lane to hold the post")
    asked = await child_conversation.ask("also this", wait=False)

    async def queued() -> bool:
        status = await tk.client.get_workflow_handle(record.conversation_id).query("status", result_type=LaneStatus)
        return status.queued_turn_ids == [asked.id] and status.active_turn_id is None

    await eventually(queued, what="the asked turn to wait in the lane")
    assert [t.status for t in await child_conversation.turns()] == ["running", "pending"]  # one turn at a time
    release.set()
    assert (await turn.result(timeout=60)).status == "completed"
    await eventually(lambda: all_finished(child_conversation, 3), what="the held turn and input to run")
    outputs = [t.output_text for t in await child_conversation.turns()]
    assert outputs == ["child saw {}", "child saw also this", "child saw and then this"]
    assert busy.client.requests[-1].messages[-1]["content"] == "and then this"  # the held input comes last
