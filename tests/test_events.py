"""``on_event`` callbacks (behaviour §3.11, issue 8 item 9): after the commit, off the event loop, sync or async,
in order per emitter, and a callback that raises or blocks never fails, retries or stalls the worker."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

import turnkit
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools


def agent(name: str, script: list[Any], tools: list[turnkit.Tool]) -> turnkit.Agent:
    return turnkit.Agent(name, model="scripted", client=ScriptedClient(script), tools=tools)


async def test_sync_and_async_callbacks_get_every_event_in_order_after_the_commit(tk: TurnKit) -> None:
    """issue 8 item 9: a sync callback runs in a thread (not the loop's), an async one on the loop; both see one
    turn's events in the order they happened, and ``tool_call.created`` only once its execution is stored."""
    loop_thread = threading.get_ident()
    sync_seen: list[tuple[str, bool]] = []
    async_seen: list[str] = []
    stored_when_created: list[bool] = []

    def on_sync(event: turnkit.Event) -> None:
        sync_seen.append((event.type, threading.get_ident() != loop_thread))

    async def on_async(event: turnkit.Event) -> None:
        async_seen.append(event.type)
        if event.type == "tool_call.created":  # the store is readable: the write committed before the event
            stored_when_created.append(bool(await tk.store.list_tool_executions(turn_id=event.turn_id)))

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
        "model.completed",
        "tool_call.created",
        "tool_call.completed",
        "model.requested",
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
    """issue 8 item 9: a sync callback blocking 3 s on one turn's event, while an at-most-once tool of another turn
    runs with a 1 s heartbeat timeout: that tool keeps heartbeating and completes (on the loop it was interrupted)."""
    turnkit.configure(tool_heartbeat_timeout=1.0)
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
            time.sleep(3)  # a slow observer (a synchronous HTTP post, say)

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
