"""Behaviour §10 acceptance cases on a real Temporal dev server (SQLite and PostgreSQL).

Joins and waits (T58, T59, T65), human controls and authorization (T89, T91), turn options and the model request
(T02, T06, T08), and tool failures seen by the model (T18, T19).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType

import turnkit
from tests.engine import Gate, HeldModel, eventually, gated_tool
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools

# Helpers ----------------------------------------------------------------------------------------------------------


def gated_child(name: str, gate: Gate) -> turnkit.Agent:
    """A sub-agent that calls its gated tool once, then answers ``"<name> done"``."""
    tool_name = f"{name}_work"

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        if request.messages[-1]["role"] == "tool":
            return turnkit.Result.build(text=f"{name} done")
        return call_tools((tool_name, {}))

    return turnkit.Agent(
        name,
        description=f"The {name} worker.",
        model="scripted",
        tools=[gated_tool(gate, tool_name)],
        client=ScriptedClient(script),
    )


def tool_results(request: turnkit.ModelRequest) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in request.messages if m["role"] == "tool"]


async def tool_messages(tk: TurnKit, turn_id: str) -> list[turnkit.MessageRecord]:
    return [m for m in await tk.turn(turn_id).messages() if m.role == "tool"]


async def tree(tk: TurnKit, root_id: str) -> list[turnkit.TurnRecord]:
    return await tk.store.list_turns(root_turn_id=root_id)


async def waits_of(tk: TurnKit, turn_id: str) -> list[Any]:
    async with tk.store.atomic() as tx:
        return await tx.list_waits(turn_id=turn_id)


async def workflow_saw_child_end(tk: TurnKit, workflow_id: str, child_id: str) -> bool:
    """Whether ``workflow_id`` recorded ``child_id``'s completion and then finished a workflow task after it.

    Once true, the parent workflow has reacted to the child's end (whatever it decided to do), so asserting that it
    still waits is meaningful rather than a race.
    """
    history = await tk.client.get_workflow_handle(workflow_id).fetch_history()
    seen = False
    for event in history.events:
        if event.HasField("child_workflow_execution_completed_event_attributes"):
            attributes = event.child_workflow_execution_completed_event_attributes
            seen = seen or attributes.workflow_execution.workflow_id == child_id
        elif seen and event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return True
    return False


# T58 / T59: implicit sub-agent joins ------------------------------------------------------------------------------


async def test_join_waits_for_every_child_and_keeps_call_order(tk: TurnKit) -> None:
    """T58: two sub-agent calls on gated children leave the parent ``waiting`` with no tool_result, and still waiting
    after the second child ends first; once both end it completes with "joined" after 2 model calls, its results in
    call order."""
    left_gate, right_gate = Gate(), Gate()
    left, right = gated_child("left", left_gate), gated_child("right", right_gate)
    client = ScriptedClient([call_tools(("left", {"task": "l"}), ("right", {"task": "r"})), "joined"])
    boss = turnkit.Agent("join_boss", model="scripted", sub_agents=[left, right], client=client)
    turn = await (await tk.conversation(boss)).ask("split", wait=False)

    await asyncio.wait_for(left_gate.entered.wait(), 30)
    await asyncio.wait_for(right_gate.entered.wait(), 30)
    records = await tree(tk, turn.id)
    children = {t.agent_name: t for t in records if t.id != turn.id}
    assert sorted(children) == ["left", "right"], records
    assert (await turn.refresh()).status == "waiting", "T58: a parent with running children must be `waiting`"
    assert await tool_messages(tk, turn.id) == [], "T58/T59: no tool_result message while the children run"

    # The SECOND child finishes first: the parent reacts to it but still waits for the first one.
    right_gate.opened.set()
    right_done = await tk.turn(children["right"].id).result(timeout=60)
    assert right_done.status == "completed" and right_done.output_text == "right done"

    async def parent_reacted() -> bool:
        return await workflow_saw_child_end(tk, turn.id, children["right"].id)

    await eventually(parent_reacted, what="the parent workflow to process the second child's end")
    assert (await turn.refresh()).status == "waiting", "T58: the parent must keep waiting until ALL children end"
    assert (await tk.turn(children["left"].id).refresh()).status == "running"
    assert await tool_messages(tk, turn.id) == [], "T58: no partial results while a child of the group runs"
    assert client.calls == 1

    left_gate.opened.set()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "joined"
    assert client.calls == 2, "T58: the parent model is called exactly twice"
    results = tool_results(client.requests[1])
    assert [r["result"] for r in results] == ["left done", "right done"], "T58: results in call order"
    assert [r["turn_id"] for r in results] == [children["left"].id, children["right"].id]
    assert [r["status"] for r in results] == ["completed", "completed"]
    # The stored transcript is in call order too, although the second child finished first.
    messages = await tool_messages(tk, turn.id)
    executions = await done.tool_executions()
    assert [e.tool_name for e in executions] == ["left", "right"]
    by_execution = {m.tool_execution_id: m.sequence for m in messages}
    assert by_execution[executions[0].id] < by_execution[executions[1].id]
    assert [e.status for e in executions] == ["completed", "completed"]


async def test_join_defers_an_invalid_calls_result_until_the_group_ends(tk: TurnKit) -> None:
    """T59: with a valid and an invalid (``task: 123``) sub-agent call, the parent waits with no tool_result, not even
    the invalid call's; once the child ends, the results come in call order and the second is an error."""
    gate = Gate()
    child = gated_child("valid", gate)
    client = ScriptedClient([call_tools(("valid", {"task": "ok"}), ("valid", {"task": 123})), "both answered"])
    boss = turnkit.Agent("defer_boss", model="scripted", sub_agents=[child], client=client)
    turn = await (await tk.conversation(boss)).ask("go", wait=False)

    await asyncio.wait_for(gate.entered.wait(), 30)

    async def waiting() -> bool:
        return (await turn.refresh()).status == "waiting"

    await eventually(waiting, what="the parent to wait on its child")
    assert len(await tree(tk, turn.id)) == 2  # the invalid call created no child
    assert await tool_messages(tk, turn.id) == [], "T59: no tool_result (not even the invalid call's) while waiting"

    gate.opened.set()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "both answered"
    first, second = tool_results(client.requests[1])
    assert first["status"] == "completed" and first["result"] == "valid done"
    assert second["error"] is True and "task" in second["message"]
    assert client.calls == 2


async def test_a_waiting_parent_with_an_old_heartbeat_stays_waiting_through_reconcile(tk: TurnKit) -> None:
    """T56: a parent waiting on its sub-agent, its ``heartbeat_at`` set to 2000, stays ``waiting`` through
    ``reconcile`` (a waiting turn does not heartbeat, and that is not staleness): nothing is repaired for it, and it
    completes once its child ends."""
    since = utcnow()
    gate = Gate()
    client = ScriptedClient([call_tools(("sleeper", {"task": "s"})), "joined"])
    boss = turnkit.Agent("heartbeat_boss", model="scripted", sub_agents=[gated_child("sleeper", gate)], client=client)
    turn = await (await tk.conversation(boss)).ask("go", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    await eventually(lambda: _status_is(tk, turn.id, "waiting"), what="the parent to wait on its child")
    old = datetime(2000, 1, 1, tzinfo=UTC)
    async with tk.store.atomic(turn_id=turn.id) as tx:
        await tx.update_turn(turn.id, heartbeat_at=old)

    reconciled = await tk.reconcile(since=since, grace=0)
    assert [r for r in reconciled.repairs if turn.id in r.ids] == [], "T56: reconcile must leave a waiting turn be"
    record = await tk.store.load_turn(turn.id)
    assert record.status == "waiting" and record.heartbeat_at == old, "T56: the parent stays `waiting`"

    gate.opened.set()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "joined" and client.calls == 2


# T65: a lane cycle rejected, then accepted once the blocking turn is cancelled ------------------------------------


async def test_wait_rejected_as_a_lane_cycle_is_accepted_after_cancel(tk: TurnKit) -> None:
    """T65: ``a.wait_for(b)``, with c queued before b in b's lane and waiting on a, raises ``ToolError`` (a lane cycle)
    and writes no wait; after ``b.cancel()`` the same wait is accepted, and a, then c, complete while b never runs."""
    a_client = ScriptedClient(["a done"])
    a_conv = await tk.conversation(turnkit.Agent("cycle_a", model="scripted", client=a_client))
    a = await a_conv.ask("a", paused=True)  # not started: it may still wait (behaviour §5.5 transition)
    x_client = ScriptedClient(lambda r: "x done")
    x_conv = await tk.conversation(turnkit.Agent("cycle_x", model="scripted", client=x_client))
    c = await x_conv.ask("c", wait_for=[a], wait=False)  # lane X: c (waits on a), then b
    b = await x_conv.ask("b", wait=False)
    assert [w.target_turn_id for w in await waits_of(tk, c.id)] == [a.id]

    with pytest.raises(turnkit.ToolError, match="wait would create a cycle"):
        await a.wait_for(b)
    assert await waits_of(tk, a.id) == [], "T65: the rejected wait wrote no edge"

    cancelled = await b.cancel()
    assert cancelled.status == "cancelled"
    accepted = await a.wait_for(b)  # b is terminal now: no cycle through lane X
    assert [w.target_turn_id for w in await waits_of(tk, a.id)] == [b.id], "T65: after b.cancel, a.wait_for(b) works"
    assert accepted.status == "paused"  # b is already terminal: a is ready, only the pause holds it

    # The graph unwinds: a runs with b's (cancelled) result as its input, then c runs after a.
    await a.resume()
    a_done = await a.result(timeout=60)
    assert a_done.status == "completed" and a_client.calls == 1
    wait_results = json.loads(a_client.requests[0].messages[-1]["content"])["wait_results"]
    assert [(r["turn_id"], r["status"]) for r in wait_results] == [(b.id, "cancelled")]
    c_done = await c.result(timeout=60)
    assert c_done.status == "completed" and c_done.output_text == "x done"
    assert (await b.refresh()).status == "cancelled" and x_client.calls == 1  # b never ran


# T89 / T91: controls and authorization ----------------------------------------------------------------------------


def only_owner(action: str, *, principal: Any, **resources: Any) -> bool:
    return principal == "owner"


async def test_only_the_owner_may_control_and_the_owner_sequence_ends_cancelled(tk: TurnKit) -> None:
    """T89: with only principal "owner" authorized, every control and read by "other" raises ``AuthorizationError``
    and leaves the paused run unchanged with no delivery; the owner's pause, cancel, resume and pause leave it
    ``cancelled`` with no inputs."""
    client = ScriptedClient(["never"])
    conversation = await tk.conversation(turnkit.Agent("owned_run", model="scripted", client=client), principal="owner")
    turn = await conversation.ask("x", paused=True)
    turnkit.configure(authorize=only_owner)
    key = f"t89-{uuid.uuid4().hex}"
    denied = {
        "pause": lambda: turn.pause(principal="other"),
        "resume": lambda: turn.resume(principal="other"),
        "steer": lambda: turn.steer("x", key=key, principal="other"),
        "cancel": lambda: turn.cancel(principal="other"),
        "read_control": lambda: turn.control_state(principal="other"),
        "send_message": lambda: conversation.post("later", key=key, principal="other"),
        "read_messages": lambda: conversation.messages_after(0, principal="other"),
    }
    for action, call in denied.items():
        with pytest.raises(turnkit.AuthorizationError, match=f"not authorized to {action}"):
            await call()
    record = (await turn.refresh()).record
    assert record.status == "paused", "T89: denied controls must not change the run"
    assert record.options.controls_or_default.pause_requested and not record.options.controls_or_default.inputs
    assert await conversation.inbox(principal="owner") == [], "T89: a denied post creates no delivery"
    assert [m.text for m in await conversation.messages(principal="owner")] == ["x"]
    assert client.calls == 0

    await turn.pause(principal="owner")
    await turn.cancel(principal="owner")
    await turn.resume(principal="owner")
    await turn.pause(principal="owner")
    state = await turn.control_state(principal="owner")
    assert state["status"] == "cancelled", "T89: cancel wins over a later resume and pause"
    assert state["controls"]["inputs"] == []
    done = await turn.result(timeout=60)
    assert done.status == "cancelled" and client.calls == 0


async def test_two_concurrent_resumes_of_an_approval_gate_call_the_model_once(tk: TurnKit) -> None:
    """T91: a turn asked ``paused=True`` (an approval gate) and resumed twice at once runs once: the turn completes
    after exactly 1 model call."""
    client = HeldModel(turnkit.Result.build(text="approved"), then="a second call")
    conversation = await tk.conversation(turnkit.Agent("gate_run", model="scripted", client=client))
    turn = await conversation.ask("needs approval", paused=True)
    assert turn.status == "paused" and client.requests == []

    first, second = await asyncio.gather(tk.turn(turn.id).resume(), tk.turn(turn.id).resume())
    # Each resume withdrew the pause: the turn is queued or already claimed, never paused, and (its model held) not
    # finished either.
    for resumed in (first, second):
        assert resumed.status in ("pending", "running"), resumed.status
        assert not resumed.record.options.controls_or_default.pause_requested
    await asyncio.wait_for(client.entered.wait(), 60)
    held = await turn.refresh()
    assert held.status == "running" and held.record.options.state.iterations == 1
    client.released.set()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "approved"
    assert len(client.requests) == 1, f"T91: two resumes must make exactly 1 model call, made {len(client.requests)}"
    assert done.record.options.state.iterations == 1
    assert [m.role for m in await conversation.messages()] == ["user", "assistant"]


# T02 / T06 / T08: turn options and the model request --------------------------------------------------------------


async def test_output_schema_reaches_the_client_and_output_data_is_stored(tk: TurnKit) -> None:
    """T02: the client receives the agent's ``output_schema``, or a per-turn one that overrides it, and the returned
    ``output_data`` is the turn's and is stored."""
    agent_schema = {"type": "object", "properties": {"label": {"type": "string"}}, "required": ["label"]}
    turn_schema = {"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]}
    client = ScriptedClient(
        [
            turnkit.Result.build(text='{"score": 7}', output_data={"score": 7}),
            turnkit.Result.build(text='{"label": "spam"}', output_data={"label": "spam"}),
        ]
    )
    agent = turnkit.Agent("structured", model="scripted", client=client, output_schema=agent_schema)
    conversation = await tk.conversation(agent)

    scored = await conversation.ask("score it", output_schema=turn_schema)
    assert client.requests[0].output_schema == turn_schema, "T02: the per-turn schema overrides the agent's"
    assert scored.status == "completed" and scored.output_data == {"score": 7}
    stored = await tk.store.load_turn(scored.id)
    assert stored.output_data == {"score": 7} and stored.options.output_schema == turn_schema

    labelled = await conversation.ask("label it")
    assert client.requests[1].output_schema == agent_schema, "T02: the client receives the agent's schema"
    assert labelled.output_data == {"label": "spam"}
    assert (await tk.store.load_turn(labelled.id)).output_data == {"label": "spam"}


async def test_thinking_per_turn_overrides_and_none_disables(tk: TurnKit) -> None:
    """T06: with the agent's thinking ``{"budget": 4000}``, the client receives it by default, a per-turn
    ``{"effort": "high"}`` instead, and ``None`` for ``thinking=None``, which is stored as an explicit ``None``."""
    client = ScriptedClient(["default", "high", "off"])
    agent = turnkit.Agent("thinker", model="scripted", client=client, thinking={"budget": 4000})
    conversation = await tk.conversation(agent)

    default = await conversation.ask("Hi")
    high = await conversation.ask("Hi", thinking={"effort": "high"})
    off = await conversation.ask("Hi", thinking=None)
    assert [r.thinking for r in client.requests] == [{"budget": 4000}, {"effort": "high"}, None], "T06"
    assert all(t.status == "completed" for t in (default, high, off))
    assert default.record.options.thinking == {"budget": 4000}
    assert high.record.options.thinking == {"effort": "high"}
    stored = (await tk.store.load_turn(off.id)).options.stored()
    assert "thinking" in stored and stored["thinking"] is None, "T06: an explicit None is persisted as None"


@turnkit.tool
def jot() -> dict[str, Any]:
    """Take a quick note."""
    return {"jotted": True}


async def test_each_turn_sees_its_frozen_snapshot(tk: TurnKit) -> None:
    """T08: each turn's requests see the snapshot frozen at its submission: both of a's hold "first" and "a" only (not
    "between" or "b", sent while a ran), and b's holds every user message but not a's output or tool calls."""
    model = HeldModel(
        call_tools(("jot", {})),
        then=lambda r: turnkit.Result.build(text="A" if r.messages[-1]["role"] == "tool" else "B"),
    )
    conversation = await tk.conversation(turnkit.Agent("snapshots", model="scripted", tools=[jot], client=model))
    await conversation.say("first")
    a = await conversation.ask("a", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)  # a is running: its first model call is in flight
    await conversation.say("between")
    b = await conversation.ask("b", wait=False)
    model.released.set()

    a_done, b_done = await a.result(timeout=60), await b.result(timeout=60)
    assert (a_done.output_text, b_done.output_text) == ("A", "B")
    assert [r.metadata["turn_id"] for r in model.requests] == [a.id, a.id, b.id]

    def user_texts(request: turnkit.ModelRequest) -> list[str]:
        return [m["content"] for m in request.messages if m["role"] == "user"]

    # a's second request is made after "between" and "b" exist: its snapshot is still frozen.
    for request in model.requests[:2]:
        assert user_texts(request) == ["first", "a"], "T08: a's request must exclude 'between' and 'b'"
    b_request = model.requests[2]
    assert user_texts(b_request) == ["first", "a", "between", "b"]
    assert not any(m["role"] != "user" for m in b_request.messages), (
        "T08: b was submitted while a was running, so b's request must exclude a's output and tool calls"
    )
    assert all(m["content"] != "A" for m in b_request.messages)


# T18 / T19: tool failures and ordinary error-shaped data ----------------------------------------------------------

explosions: list[int] = []


@turnkit.tool  # default recovery: at most once
def explode() -> dict[str, Any]:
    """Always raises a plain exception."""
    explosions.append(1)
    raise RuntimeError("boom")


@turnkit.tool
def ordinary() -> dict[str, Any]:
    """Returns data that merely looks like an error."""
    return {"error": "ordinary data"}


async def test_a_raising_tool_is_a_failed_execution_the_model_sees(tk: TurnKit) -> None:
    """T18: a tool raising ``RuntimeError("boom")`` runs once, its execution is ``failed`` with that error, the model
    sees an error tool result, and the turn completes."""
    explosions.clear()
    client = ScriptedClient([call_tools(("explode", {})), "recovered"])
    agent = turnkit.Agent("exploder", model="scripted", tools=[explode], client=client)
    turn = await (await tk.conversation(agent)).ask("try it")
    assert turn.status == "completed" and turn.output_text == "recovered", turn.error
    assert explosions == [1], "T18: an at-most-once tool body runs exactly once"
    [execution] = await turn.tool_executions()
    assert execution.status == "failed"
    assert execution.error == {"message": "RuntimeError: boom", "details": {"class": "RuntimeError"}}
    [message] = await tool_messages(tk, turn.id)
    assert message.content[0]["error"] is True
    assert tool_results(client.requests[1]) == [{"error": True, "message": "RuntimeError: boom"}], (
        "T18: the model sees the failure"
    )


async def test_error_shaped_data_is_a_completed_execution(tk: TurnKit) -> None:
    """T19: a tool returning ``{"error": "ordinary data"}`` is a ``completed`` execution with that result and no error,
    and the model receives the data as a non-error tool result."""
    client = ScriptedClient([call_tools(("ordinary", {})), "fine"])
    agent = turnkit.Agent("ordinary_data", model="scripted", tools=[ordinary], client=client)
    turn = await (await tk.conversation(agent)).ask("go")
    assert turn.status == "completed" and turn.output_text == "fine"
    [execution] = await turn.tool_executions()
    assert execution.status == "completed", "T19: only exceptions fail an execution"
    assert execution.result == {"error": "ordinary data"} and execution.error is None
    [message] = await tool_messages(tk, turn.id)
    assert message.content[0]["error"] is False
    assert tool_results(client.requests[1]) == [{"error": "ordinary data"}]


async def test_steering_a_waiting_turn_keeps_its_wait_results(tk: TurnKit) -> None:
    """Behaviour §5.5 with §5.10: a turn that waits on another (``ask(wait_for=...)``) and is steered meanwhile gets,
    in its first request, the target's result and then the steering input (the steering must not skip the join)."""
    target_conv = await tk.conversation(turnkit.Agent("steer_target", model="scripted", client=ScriptedClient(["t"])))
    target = await target_conv.ask("target", paused=True)
    waiter_client = ScriptedClient(["w done"])
    waiter_conv = await tk.conversation(turnkit.Agent("steer_waiter", model="scripted", client=waiter_client))
    waiter = await waiter_conv.ask("after the target", wait_for=[target], wait=False)
    await eventually(lambda: _status_is(tk, waiter.id, "waiting"), what="the waiter waiting on its target")
    await waiter.steer("also say hello", key="hello-1")

    await target.resume()
    done = await waiter.result(timeout=60)
    assert done.status == "completed" and waiter_client.calls == 1
    contents = [str(m.get("content")) for m in waiter_client.requests[0].messages if m.get("role") == "user"]
    assert "wait_results" in contents[-2], contents
    assert json.loads(contents[-2])["wait_results"][0]["turn_id"] == target.id
    assert contents[-1] == "also say hello"


async def _status_is(tk: TurnKit, turn_id: str, status: str) -> bool:
    return (await tk.store.load_turn(turn_id)).status == status
