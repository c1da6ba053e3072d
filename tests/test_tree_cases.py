"""Behaviour §10 cases about turn trees and deliveries on a real Temporal dev server (SQLite and PostgreSQL).

Cascade controls and an independent run of the same agent (T87), the persisted context after a cascade cancel (T79),
and deliveries applied atomically and exactly once (T77).

T92 (a cascade pause during a *blocked* ``launch_agent`` authorisation) is not here: the authorisation hook is a
sync callable that this port calls inside the ``turnkit.delegate`` activity while it holds the root lock, so a
blocking hook would stall the in-process worker's event loop (and the pause would wait for that lock anyway).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict
from typing import Any

import pytest

import turnkit
from tests.engine import eventually
from turnkit._activities.deliveries import DeliveryActivities
from turnkit._engine.deliveries import create_delivery, signal_delivery
from turnkit._engine.deliveries import reconcile as reconcile_deliveries
from turnkit.kernel.payloads import DeliverBatch
from turnkit.runtime import TurnKit
from turnkit.store.store import StoreTx, utcnow
from turnkit.testing import ScriptedClient, call_tools

TERMINAL = ("completed", "failed", "cancelled")
CANCELLED = {"class": "TurnKit::Cancelled", "message": "cancelled by application"}

# Helpers ----------------------------------------------------------------------------------------------------------


class ConversationGates:
    """Gates for a tool body, one per conversation: a test can release one run of an agent and hold another."""

    def __init__(self) -> None:
        self.opened: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.entered: list[str] = []  # conversation ids, in the order their tool call started
        self.all_open = False

    def open_all(self) -> None:
        """Release every held call, and let later ones through (a test's cleanup never leaves a tool blocked)."""
        self.all_open = True
        for event in self.opened.values():
            event.set()


def gated_tool(gates: ConversationGates, name: str) -> turnkit.Tool:
    async def body(context: turnkit.ToolContext) -> dict[str, Any]:
        gates.entered.append(context.conversation_id)
        if not gates.all_open:
            await gates.opened[context.conversation_id].wait()
        return {"done": True}

    body.__name__ = name
    body.__doc__ = "Work until released."
    return turnkit.tool(body)


def works_then_answers(tool_name: str, answer: str) -> ScriptedClient:
    """A client that calls ``tool_name`` until the transcript holds a tool result, then answers ``answer``."""

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        if any(m["role"] == "tool" for m in request.messages):
            return turnkit.Result.build(text=answer)
        return call_tools((tool_name, {}))

    return ScriptedClient(script)


async def status_of(tk: TurnKit, turn_id: str) -> str:
    return (await tk.store.load_turn(turn_id)).status


def controls(record: turnkit.TurnRecord) -> dict[str, Any]:
    return record.options.controls_or_default.model_dump()


async def workflows_closed(tk: TurnKit, turn_ids: list[str]) -> bool:
    for turn_id in turn_ids:
        description = await tk.client.get_workflow_handle(turn_id).describe()
        if description.status is None or description.status.name == "RUNNING":
            return False
    return True


# T87: cascade controls leave an independent run of the same agent alone -------------------------------------------


async def test_cascade_controls_spare_an_independent_run_of_the_child_agent(tk: TurnKit) -> None:
    """T87: a cascade pause and steer of a parent waiting on its child reach the child but not an independent run of
    the child agent, which completes untouched; after a cascade resume the parent completes, its last request ending
    with "new focus" and the child's result kept in its tool message."""
    gates = ConversationGates()
    child_client = works_then_answers("slow", "kept")
    child = turnkit.Agent("t87_worker", model="scripted", tools=[gated_tool(gates, "slow")], client=child_client)
    parent_client = ScriptedClient([call_tools(("t87_worker", {"task": "dig"})), "final"])
    parent = turnkit.Agent("t87_lead", model="scripted", sub_agents=[child], client=parent_client)
    try:
        turn = await (await tk.conversation(parent)).ask("go", wait=False)
        independent = await tk.run(child, "dig on your own", wait=False)  # its own conversation and root tree

        async def both_in_the_tool() -> bool:
            return len(gates.entered) == 2

        await eventually(both_in_the_tool, what="the child and the independent run inside their tools")
        [child_record] = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
        assert set(gates.entered) == {child_record.conversation_id, independent.record.conversation_id}
        assert independent.record.root_turn_id == independent.id != turn.id
        assert await status_of(tk, turn.id) == "waiting", "a parent blocked on its child is `waiting`"

        paused = await turn.pause(descendants="cascade")
        assert paused.status == "paused"  # waiting, so paused at once (behaviour §5.10)
        child_now = await tk.store.load_turn(child_record.id)
        assert child_now.status == "running" and controls(child_now)["pause_requested"] is True
        other = await tk.store.load_turn(independent.id)
        assert other.status == "running", f"T87: the independent run must not be paused, is {other.status}"
        assert not controls(other).get("pause_requested"), "T87: cascade pause reached a separate root run"

        receipts = await turn.steer("new focus", key=f"t87-{turn.id}", descendants="cascade")
        assert {r["turn_id"] for r in receipts} == {turn.id, child_record.id}
        assert not controls(await tk.store.load_turn(independent.id)).get("inputs"), "T87: steered a separate run"

        # Drain: the independent run completes; the child finishes its tool and acknowledges the pause.
        gates.open_all()
        done_independently = await independent.result(timeout=60)
        assert done_independently.status == "completed" and done_independently.output_text == "kept"
        await eventually(lambda: _is(tk, child_record.id, "paused"), what="the child to acknowledge the pause")
        assert await status_of(tk, turn.id) == "paused"
        independent_requests = [r for r in child_client.requests if r.metadata["turn_id"] == independent.id]
        assert len(independent_requests) == 2
        assert not any(m["content"] == "new focus" for r in independent_requests for m in r.messages)
        assert parent_client.calls == 1

        await turn.resume(descendants="cascade")
        done = await turn.result(timeout=60)
        assert done.status == "completed" and done.output_text == "final"
        child_done = await tk.store.load_turn(child_record.id)
        assert child_done.status == "completed" and child_done.output_text == "kept"
        assert (await tk.store.load_turn(independent.id)).status == "completed"
        assert parent_client.requests[-1].messages[-1] == {"role": "user", "content": "new focus"}
        [result] = [json.loads(m["content"]) for m in parent_client.requests[-1].messages if m["role"] == "tool"]
        assert (result["turn_id"], result["status"], result["result"]) == (child_record.id, "completed", "kept")
        child_requests = [r for r in child_client.requests if r.metadata["turn_id"] == child_record.id]
        assert child_requests[-1].messages[-1] == {"role": "user", "content": "new focus"}
        assert len(await tk.store.list_turns(root_turn_id=turn.id)) == 2  # no second child
    finally:
        gates.open_all()


async def _is(tk: TurnKit, turn_id: str, status: str) -> bool:
    return await status_of(tk, turn_id) == status


# T79: a cascade cancel keeps the persisted run context ------------------------------------------------------------


@pytest.mark.parametrize("start", ["run", "ask"])
async def test_cascade_cancel_keeps_the_persisted_context(tk: TurnKit, start: str) -> None:
    """T79: a cascade cancel of a root started (by ``run`` or ``ask``) with context ``{"tenant": "acme"}`` cancels
    every turn of the tree, and each keeps its persisted context: the root's ``{"tenant": "acme"}``, the children's
    empty."""
    turnkit.configure(tool_heartbeat_timeout=1.0)  # cancellation reaches a running tool through its heartbeat
    gates = ConversationGates()
    leaf = turnkit.Agent(
        "t79_leaf", model="scripted", tools=[gated_tool(gates, "dig")], client=works_then_answers("dig", "leaf done")
    )
    mid_client = ScriptedClient(
        lambda r: (
            turnkit.Result.build(text="mid done")
            if any(m["role"] == "tool" for m in r.messages)
            else call_tools(("t79_leaf", {"task": "dig deeper"}))
        )
    )
    mid = turnkit.Agent("t79_mid", model="scripted", sub_agents=[leaf], client=mid_client)
    root_client = ScriptedClient([call_tools(("t79_mid", {"task": "delegate"})), "never"])
    root_agent = turnkit.Agent("t79_root", model="scripted", sub_agents=[mid], client=root_client)
    context = {"tenant": "acme"}
    try:
        if start == "run":
            root: turnkit.Turn = await tk.run(root_agent, "split", context=context, wait=False)
        else:  # the turn's context wins over the conversation's (behaviour §1.4 build_turn)
            conversation = await tk.conversation(root_agent, context={"tenant": "conversation-default"})
            root = await conversation.ask("split", context=context, wait=False)
        context["tenant"] = "mutated after the call"  # the persisted context is a copy

        await eventually(lambda: _entered(gates), what="the leaf inside its tool")
        before = {t.agent_name: t for t in await tk.store.list_turns(root_turn_id=root.id)}
        assert set(before) == {"t79_root", "t79_mid", "t79_leaf"}
        assert before["t79_root"].options.context == {"tenant": "acme"}

        cancelled = await root.cancel(descendants="cascade")
        assert cancelled.status == "cancelled" and cancelled.error == CANCELLED
        tree = await tk.store.list_turns(root_turn_id=root.id)
        await eventually(lambda: workflows_closed(tk, [t.id for t in tree]), what="every turn workflow to end")

        after = {t.agent_name: t for t in await tk.store.list_turns(root_turn_id=root.id)}
        assert {name: t.status for name, t in after.items()} == dict.fromkeys(after, "cancelled"), (
            "T79: a cascade cancel leaves every turn of the tree cancelled"
        )
        assert all(t.error == CANCELLED for t in after.values())
        assert (await root.refresh()).record.options.context == {"tenant": "acme"}, "T79: run.turn.context"
        for name, record in after.items():
            # Each turn keeps the context it was built with; children get the task only, never the run's context
            # (behaviour §4.3 "Children do not receive the parent's history, tools or run context").
            assert record.options.context == before[name].options.context, f"{name}'s context changed"
        assert after["t79_mid"].options.context == {} and after["t79_leaf"].options.context == {}
        assert root_client.calls == 1 and mid_client.calls == 1
    finally:
        gates.open_all()


async def _entered(gates: ConversationGates) -> bool:
    return len(gates.entered) == 1


# T77: a delivery is applied exactly once, atomically with being marked --------------------------------------------


def echo_agent(name: str) -> tuple[turnkit.Agent, ScriptedClient]:
    client = ScriptedClient(lambda request: turnkit.Result.build(text=f"seen {len(request.messages)}"))
    return turnkit.Agent(name, model="scripted", client=client), client


async def stored_delivery(tk: TurnKit, conversation: turnkit.Conversation, text: str) -> turnkit.DeliveryRecord:
    """A delivery row for ``conversation`` with no signal sent: nothing applies it unless the test does."""
    async with tk.store.atomic() as tx:
        return await create_delivery(
            tx,
            source_conversation_id=conversation.id,
            destination_conversation_id=conversation.id,
            key=f"t77-{conversation.id}-{uuid.uuid4().hex}",
            text=text,
        )


async def delivered_messages(tk: TurnKit, conversation_id: str, delivery_id: str) -> list[turnkit.MessageRecord]:
    return [m for m in await tk.store.list_messages(conversation_id) if m.metadata.get("delivery_id") == delivery_id]


class Injected(Exception):
    pass


@pytest.mark.parametrize("fail", ["mark_delivered", "create_turn"])
async def test_a_failing_delivery_apply_rolls_back_message_and_mark(
    tk: TurnKit, monkeypatch: pytest.MonkeyPatch, fail: str
) -> None:
    """T77: the deliver activity's update_delivery (``mark_delivered``) failing, or the wake's turn creation failing
    after the mark, leaves no message, no ``delivered_at`` and no turn; the next apply delivers exactly once."""
    agent, client = echo_agent("t77_rollback")
    conversation = await tk.conversation(agent)
    delivery = await stored_delivery(tk, conversation, "all or nothing")
    activities = DeliveryActivities(tk.store)
    batch = DeliverBatch(conversation_id=conversation.id, delivery_ids=[delivery.id], wake=True)
    calls: list[str] = []

    async def injected(self: StoreTx, *args: Any, **kwargs: Any) -> Any:
        calls.append(fail)
        raise Injected(fail)

    with monkeypatch.context() as patch:
        patch.setattr(StoreTx, fail, injected)
        with pytest.raises(Injected):
            await activities.deliver(batch)
    assert calls == [fail], "the failure must come from inside the deliver activity"

    async with tk.store.atomic() as tx:
        stored = await tx.load_delivery(delivery.id)
    assert stored.delivered_at is None and stored.message_id is None, "T77: the mark must roll back"
    assert await tk.store.list_messages(conversation.id) == [], "T77: the message must roll back"
    assert await tk.store.list_turns(conversation_id=conversation.id) == [], "T77: no turn"

    # The next apply works, exactly once, and reuses the sequence the rolled-back message had.
    applied = await activities.deliver(batch)
    again = await activities.deliver(batch)
    turns = await tk.store.list_turns(conversation_id=conversation.id)
    try:
        assert applied.delivered_ids == [delivery.id] and again.delivered_ids == []
        [message] = await tk.store.list_messages(conversation.id)
        assert (message.sequence, message.text, message.metadata["delivery_id"]) == (1, "all or nothing", delivery.id)
        async with tk.store.atomic() as tx:
            stored = await tx.load_delivery(delivery.id)
        assert stored.message_id == message.id and stored.delivered_at is not None
        [turn] = turns
        assert turn.options.trigger_message_id == message.id and turn.status == "pending"
        assert applied.turn is not None and applied.turn.turn_id == turn.id and again.turn is None
        assert client.calls == 0
    finally:
        for turn in turns:  # no lane runs these turns: end them so that nothing is left pending
            await tk.turn(turn.id).cancel()


async def test_duplicate_signals_and_a_reconcile_apply_a_delivery_once(tk: TurnKit) -> None:
    """T77 through the real lane: one stored delivery signalled twice at once, and found again by the delivery
    reconciler meanwhile, gives 1 message, 1 ``delivered_at`` and 1 continuation turn, which runs once."""
    since = utcnow()  # the reconciler re-signals this test's deliveries only: others' lanes are not this worker's
    agent, client = echo_agent("t77_race")
    conversation = await tk.conversation(agent)
    delivery = await stored_delivery(tk, conversation, "once")

    await asyncio.gather(
        signal_delivery(tk.client, tk.task_queue, delivery),
        signal_delivery(tk.client, tk.task_queue, delivery),
        reconcile_deliveries(tk.store, tk.client, tk.task_queue, since=since),
    )

    async def finished() -> bool:
        turns = await tk.store.list_turns(conversation_id=conversation.id)
        return bool(turns) and all(t.status in TERMINAL for t in turns)

    await eventually(finished, what="the delivery's continuation turn")
    [message] = await delivered_messages(tk, conversation.id, delivery.id)
    assert message.text == "once" and message.sequence == 1
    async with tk.store.atomic() as tx:
        stored = await tx.load_delivery(delivery.id)
    assert stored.message_id == message.id and stored.delivered_at is not None
    [turn] = await tk.store.list_turns(conversation_id=conversation.id)
    assert turn.status == "completed" and turn.options.trigger_message_id == message.id
    assert client.calls == 1
    assert [m.role for m in await tk.store.list_messages(conversation.id)] == ["user", "assistant"]


async def test_one_delivery_applied_concurrently_twice_gives_one_message_and_one_turn(tk: TurnKit) -> None:
    """T77: one delivery applied by two concurrent deliver activities is applied exactly once: 1 message, 1
    ``delivered_at`` and 1 submitted continuation turn, with the conversation's principal."""
    agent, client = echo_agent("t77_twice")
    conversation = await tk.conversation(agent, principal="owner")
    delivery = await stored_delivery(tk, conversation, "deliver me once")
    activities = DeliveryActivities(tk.store)
    batch = DeliverBatch(conversation_id=conversation.id, delivery_ids=[delivery.id], wake=True)

    first, second = await asyncio.gather(activities.deliver(batch), activities.deliver(batch))

    assert sorted([first.delivered_ids, second.delivered_ids]) == [[], [delivery.id]], "T77: applied exactly once"
    [message] = await tk.store.list_messages(conversation.id)
    assert message.text == "deliver me once" and message.metadata["delivery_id"] == delivery.id
    turns = await tk.store.list_turns(conversation_id=conversation.id)
    try:
        assert len(turns) == 1, f"T77: exactly 1 continuation turn, got {len(turns)}"
        [turn] = turns
        assert turn.submitted_at is not None and turn.status == "pending"
        assert turn.options.trigger_message_id == message.id and turn.options.principal == "owner"
        assert [r.turn.turn_id for r in (first, second) if r.turn is not None] == [turn.id]
        async with tk.store.atomic() as tx:
            stored = await tx.load_delivery(delivery.id)
        assert stored.message_id == message.id and stored.delivered_at is not None
        assert client.calls == 0
    finally:
        for turn in turns:  # no lane runs these turns: end them so that nothing is left pending
            await tk.turn(turn.id).cancel()


async def test_a_failing_mark_in_the_lane_writes_nothing_then_delivers_once(
    tk: TurnKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T77 through the real lane: a posted input whose ``mark_delivered`` fails leaves no message, no ``delivered_at``
    and no turn while the activity retries; once the mark works it is delivered once and its turn completes."""
    agent, client = echo_agent("t77_lane")
    conversation = await tk.conversation(agent)
    failing = True
    failures: list[str] = []
    original = StoreTx.mark_delivered

    async def flaky(self: StoreTx, delivery_id: str, *, message_id: str) -> Any:
        if failing and (await self.load_delivery(delivery_id)).destination_conversation_id == conversation.id:
            failures.append(message_id)
            raise RuntimeError("update_delivery failed (injected)")
        return await original(self, delivery_id, message_id=message_id)

    monkeypatch.setattr(StoreTx, "mark_delivered", flaky)
    posted = await conversation.post("hello", key=f"t77-lane-{conversation.id}")

    async def retried() -> bool:
        return len(failures) >= 2  # a second attempt started: the first one's transaction is over

    await eventually(retried, what="the deliver activity to fail and retry")
    assert len(set(failures)) == len(failures), "each attempt appended (then lost) its own message"
    assert await tk.store.list_messages(conversation.id) == [], "T77: no message after a failed update_delivery"
    assert (await conversation.input_status(posted.id))["delivered_at"] is None, "T77: no delivered_at"
    assert await tk.store.list_turns(conversation_id=conversation.id) == [], "T77: no turn"

    failing = False

    async def finished() -> bool:
        turns = await tk.store.list_turns(conversation_id=conversation.id)
        return len(turns) == 1 and turns[0].status in TERMINAL

    await eventually(finished, what="the retried delivery's turn")
    [message] = await tk.store.list_messages(conversation.id, through_sequence=1)
    assert message.text == "hello" and message.metadata["delivery_id"] == posted.id
    assert message.id not in failures
    status = await conversation.input_status(posted.id)
    assert status["message_id"] == message.id and status["delivered_at"] is not None
    [turn] = await tk.store.list_turns(conversation_id=conversation.id)
    assert turn.status == "completed" and turn.options.trigger_message_id == message.id
    assert status["application"]["turn_id"] == turn.id
    assert [m.metadata.get("delivery_id") for m in await tk.store.list_messages(conversation.id)].count(posted.id) == 1
    assert client.calls == 1
