"""``on_event`` callbacks (behaviour §3.11, issue 8 item 9): after the commit, off the event loop, sync or async,
in order per emitter, and a callback that raises or blocks never fails, retries or stalls the worker."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import turnkit
from turnkit.model import ToolCall
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools


def agent(name: str, script: list[Any], tools: list[turnkit.Tool]) -> turnkit.Agent:
    return turnkit.Agent(name, model="scripted", client=ScriptedClient(script), tools=tools)


async def test_sync_and_async_callbacks_get_every_event_in_order_after_the_commit(tk: TurnKit) -> None:
    """issue 8 item 9: a sync callback runs in a thread (not the loop's), an async one on the loop; both see one
    turn's events in the order they happened, and ``tool_call.created`` only once the message proposing it is stored
    (spec §3.7)."""
    loop_thread = threading.get_ident()
    sync_seen: list[tuple[str, bool]] = []
    async_seen: list[str] = []
    stored_when_created: list[bool] = []

    def on_sync(event: turnkit.Event) -> None:
        sync_seen.append((event.type, threading.get_ident() != loop_thread))

    async def on_async(event: turnkit.Event) -> None:
        async_seen.append(event.type)
        if event.type == "tool_call.created":  # the store is readable: the write committed before the event
            messages = await tk.store.list_messages(event.conversation_id, turn_id=event.turn_id)
            proposals = [p["id"] for m in messages for p in m.content if p.get("type") == "tool_call"]
            stored_when_created.append(event.payload["id"] in proposals)

    @turnkit.tool
    def lookup() -> dict[str, Any]:
        """Look something up."""
        return {"found": True}

    turnkit.configure(on_event=[on_sync, on_async])
    conversation = await tk.conversation(agent("observed", [call_tools(("lookup", {})), "done"], [lookup]))
    turn = await conversation.ask("x")
    assert turn.status == "completed"
    expected = [
        "turn.started",
        "model.requested",
        "message.created",
        "tool_call.created",
        "model.completed",
        "message.created",
        "tool_call.completed",
        "model.requested",
        "message.created",
        "model.completed",
        "turn.completed",
    ]
    assert [t for t, _ in sync_seen] == expected and async_seen == expected
    assert all(off_loop for _, off_loop in sync_seen), "a sync on_event callback ran on the event loop"
    assert stored_when_created == [True]


async def test_a_raising_callback_fails_and_retries_nothing(tk: TurnKit, caplog: pytest.LogCaptureFixture) -> None:
    """issue 8 item 9: a callback that raises on every event is logged; the turn completes, the model is called
    twice and the at-most-once tool ran once (no store activity retried after its commit)."""
    runs: list[str] = []

    @turnkit.tool
    def charge() -> dict[str, Any]:
        """At most once."""
        runs.append("charge")
        return {"charged": True}

    def crash(event: turnkit.Event) -> None:
        raise RuntimeError(f"observer down on {event.type}")

    turnkit.configure(on_event=crash)
    client = ScriptedClient([call_tools(("charge", {})), "charged"])
    conversation = await tk.conversation(turnkit.Agent("payer", model="scripted", client=client, tools=[charge]))
    with caplog.at_level("WARNING", logger="turnkit.events"):
        turn = await conversation.ask("x")
    assert turn.status == "completed" and turn.output_text == "charged"
    assert client.calls == 2 and runs == ["charge"]
    [execution] = await turn.tool_executions()
    assert execution.status == "completed"
    logged = [r for r in caplog.records if r.name == "turnkit.events"]
    assert logged and all(isinstance(r.exc_info[1], RuntimeError) for r in logged if r.exc_info)


async def test_a_slow_sync_callback_does_not_stall_another_turns_tool(tk: TurnKit) -> None:
    """issue 8 item 9: a sync callback blocking 9 s on one turn's event, while an at-most-once tool of another turn
    runs with a 4 s heartbeat timeout: that tool keeps heartbeating and completes (on the loop it was interrupted).
    The SDK sends a heartbeat at most every 0.8 timeouts, so a beat reaches the server with a fifth of the timeout to
    spare: 0.8 s here (0.4 s at 2 s was too little for a loaded machine); the block is still more than twice as
    long as the timeout."""
    turnkit.configure(tool_heartbeat_timeout=4.0)
    steady_entered, second_done = asyncio.Event(), asyncio.Event()
    blocked = threading.Event()

    @turnkit.tool
    async def steady() -> dict[str, Any]:
        """At most once; runs until the other turn is over (its activity must heartbeat all along)."""
        steady_entered.set()
        await second_done.wait()
        return {"steady": True}

    @turnkit.tool
    def noted() -> dict[str, Any]:
        """Its creation is observed slowly."""
        return {"noted": True}

    def slow_observer(event: turnkit.Event) -> None:
        if event.type == "tool_call.created" and event.payload.get("name") == "noted":
            blocked.set()
            time.sleep(9)  # a slow observer (a synchronous HTTP post, say)

    turnkit.configure(on_event=slow_observer)
    healthy = await (await tk.conversation(agent("first", [call_tools(("steady", {})), "a"], [steady]))).ask(
        "x", wait=False
    )
    await asyncio.wait_for(steady_entered.wait(), 30)
    slow = await (await tk.conversation(agent("second", [call_tools(("noted", {})), "b"], [noted]))).ask(
        "x", wait=False
    )
    slow = await slow.result(timeout=60)
    second_done.set()
    healthy = await healthy.result(timeout=60)
    assert blocked.is_set()
    [noted_run] = await slow.tool_executions()
    assert noted_run.status == "completed", (noted_run.status, noted_run.error)
    [steady_run] = await healthy.tool_executions()
    assert steady_run.status == "completed", (steady_run.status, steady_run.error)


# -- spec §3.11 / §3.7 / §3.8: every event, each after its write ------------------------------------------------------


class Recorder:
    """An async ``on_event`` callback that records every event and, for each, checks in the store (through another
    connection) that the write it reports is there: an event sent before its commit would find nothing."""

    def __init__(self, tk: TurnKit) -> None:
        self.store = tk.store
        self.events: list[turnkit.Event] = []
        self.unseen: list[tuple[str, dict[str, Any]]] = []  # events whose write was not visible when they arrived

    async def __call__(self, event: turnkit.Event) -> None:
        self.events.append(event)
        if not await self._write_visible(event):
            self.unseen.append((event.type, event.payload))

    async def _write_visible(self, event: turnkit.Event) -> bool:
        payload = event.payload
        if event.type == "message.created":
            messages = await self.store.list_messages(event.conversation_id)
            return any(
                (m.id, m.role, m.kind, m.turn_id)
                == (payload["message_id"], payload["role"], payload["kind"], event.turn_id)
                for m in messages
            )
        if event.type in ("tool_call.created", "tool_call.skipped"):
            # The assistant message proposing the call (spec §3.7), and for a skip its cancelled execution (§3.8).
            messages = await self.store.list_messages(event.conversation_id, turn_id=event.turn_id)
            proposed = any(
                p.get("type") == "tool_call" and p.get("id") == payload["id"] for m in messages for p in m.content
            )
            if event.type == "tool_call.created":
                return proposed
            return proposed and await self._execution_status(event) == "cancelled"
        if event.type in ("tool_call.completed", "tool_call.failed"):
            status = await self._execution_status(event)
            results = [
                p
                for m in await self.store.list_messages(event.conversation_id, turn_id=event.turn_id)
                if m.kind == "tool_result"
                for p in m.content
                if p.get("tool_call_id") == payload["id"]
            ]
            settled = status == event.type.removeprefix("tool_call.")
            return settled and len(results) == 1 and len(results[0]["text"]) == payload["result_chars"]
        if event.type in ("turn.completed", "turn.failed"):
            return (await self.store.load_turn(event.turn_id)).status == event.type.removeprefix("turn.")
        if event.type == "model.completed":
            turn = await self.store.load_turn(event.turn_id)
            return turn.usage.get("total_tokens", 0) >= sum(
                e.payload["usage"]["total_tokens"]
                for e in self.events
                if e.type == "model.completed" and e.turn_id == event.turn_id
            )
        return True

    async def _execution_status(self, event: turnkit.Event) -> str | None:
        for execution in await self.store.list_tool_executions(turn_id=event.turn_id):
            if execution.tool_call_id == event.payload["id"]:
                return execution.status
        return None

    def types(self) -> list[str]:
        return [event.type for event in self.events]

    def of(self, type: str) -> list[dict[str, Any]]:
        return [event.payload for event in self.events if event.type == type]


async def stored_turn_messages(tk: TurnKit, turn: turnkit.Turn) -> list[turnkit.MessageRecord]:
    record = await tk.store.load_turn(turn.id)
    return [m for m in await tk.store.list_messages(record.conversation_id) if m.turn_id == turn.id]


async def test_a_tool_turn_sends_every_event_in_spec_order_each_after_its_write(tk: TurnKit) -> None:
    """Spec §3.11, §3.7, §3.2 (T12 extended): a turn with one tool call sends message.created for each message it
    writes, then tool_call.created {id, name} per proposed call, before model.completed; tool_call.completed carries
    name and result_chars; every event's write is readable from another connection when the event arrives."""

    @turnkit.tool
    def lookup() -> dict[str, Any]:
        """Look something up."""
        return {"found": True}

    recorder = Recorder(tk)
    turnkit.configure(on_event=recorder)
    conversation = await tk.conversation(agent("spec-order", [call_tools(("lookup", {})), "done"], [lookup]))
    turn = await conversation.ask("x")
    assert turn.status == "completed"
    assert recorder.types() == [
        "turn.started",
        "model.requested",
        "message.created",  # the assistant's tool_call message
        "tool_call.created",
        "model.completed",
        "message.created",  # the tool result
        "tool_call.completed",
        "model.requested",
        "message.created",  # the final text
        "model.completed",
        "turn.completed",
    ]
    assert recorder.unseen == []
    assert {e.turn_id for e in recorder.events} == {turn.id}
    [execution] = await turn.tool_executions()
    [created] = recorder.of("tool_call.created")
    assert created == {"id": execution.tool_call_id, "name": "lookup"}
    [completed] = recorder.of("tool_call.completed")
    assert completed == {"id": execution.tool_call_id, "name": "lookup", "result_chars": len('{"found": true}')}
    # Spec §3.7: message.created {message_id, role, kind} for each message the turn wrote, and only those.
    stored = await stored_turn_messages(tk, turn)
    assert recorder.of("message.created") == [{"message_id": m.id, "role": m.role, "kind": m.kind} for m in stored]
    assert [(m["role"], m["kind"]) for m in recorder.of("message.created")] == [
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("assistant", "text"),
    ]


async def test_unknown_invalid_denied_and_raising_calls_each_send_tool_call_failed(tk: TurnKit) -> None:
    """Spec §3.8 steps 3, 4, 7, 12, 13 and §3.11: an unknown tool, unparseable arguments, an authorization denial and
    a ToolError each send tool_call.failed {id, name, error, result_chars} after the failure is stored (never
    tool_call.completed), and the turn goes on."""

    @turnkit.tool
    def lookup() -> dict[str, Any]:
        """Look something up."""
        return {"found": True}

    @turnkit.tool
    def broken() -> dict[str, Any]:
        """Always fails."""
        raise turnkit.ToolError("broken on purpose")

    class DenyLookup:
        def __call__(self, action: str, *, principal: Any, **resources: Any) -> bool:
            tool = resources.get("tool")
            return not (action == "tool" and getattr(tool, "name", None) == "lookup")

    recorder = Recorder(tk)
    turnkit.configure(on_event=recorder, authorize=DenyLookup())
    proposal = call_tools(
        ("missing_tool", {}),
        ToolCall.parse("", "broken", "{not json"),
        ("lookup", {}),
        ("broken", {}),
    )
    conversation = await tk.conversation(agent("failing", [proposal, "fine"], [lookup, broken]))
    turn = await conversation.ask("x")
    assert turn.status == "completed"
    executions = {e.tool_call_id: e for e in await turn.tool_executions()}
    calls = [p for p in recorder.of("tool_call.created")]
    assert [c["name"] for c in calls] == ["missing_tool", "broken", "lookup", "broken"]
    failed = recorder.of("tool_call.failed")
    assert [(f["id"], f["name"]) for f in failed] == [(c["id"], c["name"]) for c in calls]
    assert [f["error"] for f in failed] == [
        "unknown tool: missing_tool",
        "invalid JSON arguments",
        executions[calls[2]["id"]].error["message"],  # the hook's denial message
        "broken on purpose",
    ]
    assert all(executions[f["id"]].status == "failed" and f["result_chars"] > 0 for f in failed)
    assert recorder.of("tool_call.completed") == []
    assert recorder.unseen == []


async def test_an_over_budget_call_sends_tool_call_failed_then_turn_failed(tk: TurnKit) -> None:
    """Spec §3.8 step 2.2, §6.2 and §3.11: a call denied by max_tool_executions sends tool_call.failed with the budget
    error (after the denial is stored), then the turn fails and sends turn.failed; nothing is sent twice."""

    @turnkit.tool
    def lookup() -> dict[str, Any]:
        """Look something up."""
        return {"found": True}

    recorder = Recorder(tk)
    turnkit.configure(on_event=recorder)
    a = turnkit.Agent(
        "over-budget",
        model="scripted",
        client=ScriptedClient([call_tools(("lookup", {}), ("lookup", {})), "never"]),
        tools=[lookup],
        max_tool_executions=1,
    )
    turn = await (await tk.conversation(a)).ask("x")
    assert turn.status == "failed"
    first, second = recorder.of("tool_call.created")
    assert recorder.of("tool_call.completed") == [{"id": first["id"], "name": "lookup", "result_chars": 15}]
    [failed] = recorder.of("tool_call.failed")
    assert failed["id"] == second["id"] and failed["name"] == "lookup"
    assert failed["error"] == "maximum tool executions reached"
    assert recorder.types()[-1] == "turn.failed" and len(recorder.of("turn.failed")) == 1
    assert recorder.of("turn.failed")[0]["error"]["message"] == "maximum tool executions reached"
    assert recorder.of("turn.completed") == []
    assert recorder.unseen == []


async def test_calls_after_a_terminal_tool_send_tool_call_skipped(tk: TurnKit) -> None:
    """Spec §3.8 terminal skipping and §3.11: each call after a terminal tool gets a cancelled execution and sends
    tool_call.skipped {id, name} once stored; the completion message sends message.created, then turn.completed."""

    @turnkit.tool(terminal="All done.")
    def finish() -> dict[str, Any]:
        """Ends the turn."""
        return {"ok": True}

    @turnkit.tool
    def later() -> dict[str, Any]:
        """Never runs here."""
        return {"ran": True}

    recorder = Recorder(tk)
    turnkit.configure(on_event=recorder)
    proposal = call_tools(("finish", {}), ("later", {}), ("later", {}))
    turn = await (await tk.conversation(agent("terminal", [proposal], [finish, later]))).ask("x")
    assert turn.status == "completed" and turn.output_text == "All done."
    created = recorder.of("tool_call.created")
    assert recorder.of("tool_call.skipped") == [{"id": c["id"], "name": "later"} for c in created[1:]]
    assert [c["id"] for c in recorder.of("tool_call.completed")] == [created[0]["id"]]
    assert recorder.types()[-2:] == ["message.created", "turn.completed"]
    assert recorder.of("message.created")[-1]["role"] == "assistant"
    assert recorder.unseen == []
    statuses = sorted(e.status for e in await turn.tool_executions())
    assert statuses == ["cancelled", "cancelled", "completed"]


async def test_a_sub_agent_call_is_created_and_completed_like_any_call(tk: TurnKit) -> None:
    """Spec §3.7, §3.8, §5.5 and §3.11: a delegated call sends tool_call.created when proposed and
    tool_call.completed when the join records the child's result; the child's own turn sends its events too."""
    recorder = Recorder(tk)
    turnkit.configure(on_event=recorder)
    child = turnkit.Agent("helper", model="scripted", client=ScriptedClient(["child answer"]))
    boss = turnkit.Agent(
        "boss",
        model="scripted",
        client=ScriptedClient([call_tools(("helper", {"task": "t"})), "boss done"]),
        sub_agents=[child],
    )
    turn = await (await tk.conversation(boss)).ask("x")
    assert turn.status == "completed"
    [created] = [e for e in recorder.events if e.type == "tool_call.created" and e.turn_id == turn.id]
    assert created.payload["name"] == "helper"
    [completed] = [e for e in recorder.events if e.type == "tool_call.completed" and e.turn_id == turn.id]
    assert completed.payload["id"] == created.payload["id"] and completed.payload["name"] == "helper"
    child_turns = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    [child_turn] = child_turns
    assert [e.type for e in recorder.events if e.turn_id == child_turn.id][-1] == "turn.completed"
    # The join settles the call after the child ended: its event comes after the child's turn.completed.
    child_done = next(
        i for i, e in enumerate(recorder.events) if e.turn_id == child_turn.id and e.type == "turn.completed"
    )
    assert recorder.events.index(completed) > child_done
    assert recorder.unseen == []


def _kid_and_boss(boss_on_event: Any = None, kid_on_event: Any = None) -> turnkit.Agent:
    kid = turnkit.Agent("kid", model="scripted", client=ScriptedClient(lambda _: "kid done"), on_event=kid_on_event)
    boss_script = ScriptedClient(
        lambda r: "boss done" if r.messages[-1]["role"] == "tool" else call_tools(("kid", {"task": "help"}))
    )
    return turnkit.Agent("boss", model="scripted", sub_agents=[kid], client=boss_script, on_event=boss_on_event)


def _turns_of(events: list[turnkit.Event]) -> set[str]:
    return {event.turn_id for event in events}


async def test_agent_on_event_replaces_the_global_one_and_children_inherit_it(tk: TurnKit) -> None:
    """Spec §3.11, §1.2 ``on_event``, §4.3 ``build_child``: an agent's callback gets its turns' events instead of the
    global one, and a sub-agent's turn goes to its parent agent's effective callback, not to the sub-agent's own."""
    boss_events: list[turnkit.Event] = []
    kid_events: list[turnkit.Event] = []
    global_events: list[turnkit.Event] = []
    turnkit.configure(on_event=global_events.append)
    turn = await (await tk.conversation(_kid_and_boss(boss_events.append, kid_events.append))).ask("go")
    assert turn.status == "completed"
    [child] = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    assert _turns_of(boss_events) == {turn.id, child.id}
    child_types = [e.type for e in boss_events if e.turn_id == child.id]
    assert child_types[0] == "turn.started" and child_types[-1] == "turn.completed"
    assert [e.type for e in boss_events if e.turn_id == turn.id][-1] == "turn.completed"
    assert kid_events == [] and global_events == []


async def test_a_sub_agent_with_no_inherited_callback_uses_its_own(tk: TurnKit) -> None:
    """Spec §3.11: with no callback on the parent agent and none global, the child's turn falls back to its own
    agent's ``on_event``; the parent's events go nowhere."""
    kid_events: list[turnkit.Event] = []
    turn = await (await tk.conversation(_kid_and_boss(None, kid_events.append))).ask("go")
    [child] = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    assert _turns_of(kid_events) == {child.id}
    assert [e.type for e in kid_events][-1] == "turn.completed"


async def test_a_turn_on_event_replaces_the_agent_and_global_ones(tk: TurnKit) -> None:
    """Spec §3.11, §1.4 ``build_turn(on_event:)``: ``ask(on_event=...)`` and ``run(on_event=...)`` get that turn's
    events (the worker runs in this process) and nobody else does; the next turn without one goes to the agent's
    again; its sub-agent still inherits the parent agent's callback (§4.3), never the turn's."""
    boss_events: list[turnkit.Event] = []
    asked: list[turnkit.Event] = []
    global_events: list[turnkit.Event] = []
    turnkit.configure(on_event=global_events.append)
    conversation = await tk.conversation(_kid_and_boss(boss_events.append))
    turn = await conversation.ask("go", on_event=asked.append)
    [child] = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    assert _turns_of(asked) == {turn.id} and [e.type for e in asked][-1] == "turn.completed"
    assert _turns_of(boss_events) == {child.id} and global_events == []
    again = await conversation.ask("again")
    [again_child] = [t for t in await tk.store.list_turns(root_turn_id=again.id) if t.id != again.id]
    assert _turns_of(boss_events) == {child.id, again.id, again_child.id}
    assert _turns_of(asked) == {turn.id}  # the per-turn callback ended with its turn

    ran: list[turnkit.Event] = []

    async def on_run(event: turnkit.Event) -> None:
        ran.append(event)

    run = await tk.run(turnkit.Agent("solo", model="scripted", client=ScriptedClient(["ok"])), "t", on_event=on_run)
    assert run.status == "completed"
    assert [e.type for e in ran] == [
        "turn.started",
        "model.requested",
        "message.created",
        "model.completed",
        "turn.completed",
    ]
    assert _turns_of(global_events) == set()


async def test_on_event_that_is_not_callable_is_refused_before_anything_is_written(tk: TurnKit) -> None:
    """Spec §1.2 / §1.4 ``on_event``: a value that is neither a callable nor a list of callables is refused."""
    with pytest.raises(TypeError, match="on_event must be a callable or a list of callables"):
        turnkit.Agent("bad", model="scripted", on_event="print")
    conversation = await tk.conversation(turnkit.Agent("fine", model="scripted", client=ScriptedClient(["ok"])))
    with pytest.raises(turnkit.InputError, match="on_event must be a callable or a list of callables"):
        await conversation.ask("x", on_event=[print, 3])
    assert await conversation.messages() == []
    with pytest.raises(turnkit.InputError, match="on_event must be a callable"):
        await tk.run(turnkit.Agent("fine2", model="scripted"), "t", on_event=42)
    assert [t for t in await tk.store.list_turns() if t.agent_name == "fine2"] == []


class CachingClient:
    """A model client of an application's own that reports its cache hits as events while it answers."""

    def __init__(self) -> None:
        self.calls = 0

    async def chat(self, request: turnkit.ModelRequest) -> turnkit.Result:
        self.calls += 1
        await turnkit.client_event("cache.hit", key=f"prompt-{self.calls}", saved_tokens=120)
        return turnkit.Result.build(text="from the cache")


async def test_a_client_emits_events_that_reach_the_turns_callback_with_its_ids(tk: TurnKit) -> None:
    """Behaviour §3.6 (the client's ``on_event``) and §3.11 "plus any events the client emits": an event a model
    client emits while it answers reaches the agent's callback with the turn's and conversation's ids, between
    ``model.requested`` and ``model.completed``; outside a turn's call it goes nowhere; a bad type or payload is an
    ``InputError``."""
    events: list[turnkit.Event] = []
    client = CachingClient()
    agent = turnkit.Agent("cached", model="scripted", client=client, on_event=events.append)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("hello")

    assert turn.status == "completed" and turn.output_text == "from the cache", turn.error
    [hit] = [e for e in events if e.type == "cache.hit"]
    assert (hit.turn_id, hit.conversation_id) == (turn.id, conversation.id)
    assert hit.payload == {"key": "prompt-1", "saved_tokens": 120}
    types = [e.type for e in events]
    assert types.index("model.requested") < types.index("cache.hit") < types.index("model.completed")

    outside = await client.chat(turnkit.ModelRequest(model="scripted"))  # no turn: the event goes nowhere
    assert outside.text == "from the cache" and len([e for e in events if e.type == "cache.hit"]) == 1
    with pytest.raises(turnkit.InputError, match="an event type must be a non-empty string"):
        await turnkit.client_event("")
    with pytest.raises(turnkit.InputError, match=r"event cache\.hit has a payload that is not JSON"):
        await turnkit.client_event("cache.hit", key=object())
