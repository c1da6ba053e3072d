"""History limits (issue 8 item 5): lanes and turns continue as new instead of being terminated at the limit, and a
turn workflow that ends abnormally gets a terminal record.

The limit tests run on a private dev server started with low history limits (real limits, enforced by the server):
a workflow whose history reaches ``ERROR_LIMIT`` events is terminated by the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Replayer

import turnkit
from tests.engine import Gate, eventually, gated_tool
from tests.faults import DevServer, dev_server
from tests.history_scenarios import carried_turn, patch_markers
from turnkit._engine.builtin_tools import launch_agent, wait_for
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools

SUGGEST_AT = 60
ERROR_LIMIT = 160  # a turn of one tool call costs the lane ~20 events: 12 queued turns are well past it


def limits() -> list[str]:
    values = {"warn": SUGGEST_AT, "suggestContinueAsNew": SUGGEST_AT, "error": ERROR_LIMIT}
    flags: list[str] = []
    for key, value in values.items():
        flags += ["--dynamic-config-value", f"limit.historyCount.{key}={value}"]
    return flags


@contextlib.asynccontextmanager
async def turnkit_on(server: DevServer, database_url: str) -> AsyncIterator[TurnKit]:
    """A TurnKit connection to ``server`` with an in-process worker (as the ``engine`` fixture builds one)."""
    store = await Store.open(database_url)
    try:
        client = await Client.connect(server.address, plugins=[TurnKitPlugin(store)])
        tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
        async with tk.worker():
            yield tk
    finally:
        await store.close()


async def runs_of(client: Client, workflow_id: str) -> list[str]:
    """Close statuses of every run of ``workflow_id`` (oldest first), from visibility."""
    runs = [execution async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    runs.sort(key=lambda execution: execution.start_time)
    return [execution.status.name if execution.status else "RUNNING" for execution in runs]


async def replay_closed_runs(client: Client, workflow_id: str) -> int:
    """Replay each closed run of ``workflow_id`` with today's code, configured like a worker; returns how many.

    Only closed runs: a run that just continued as new may show a history of one event for a moment (the server delays
    its first workflow task, ``firstWorkflowTaskBackoff``), and the replayer waits forever on a history without a
    workflow task. A closed run's history is final, and it holds every rollover path."""
    replayer = Replayer(workflows=[], plugins=[TurnKitPlugin()])
    runs = 0
    async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}' AND ExecutionStatus != 'Running'"):
        await replayer.replay_workflow(
            await client.get_workflow_handle(workflow_id, run_id=execution.run_id).fetch_history()
        )
        runs += 1
    return runs


@turnkit.tool(recovery="replay_safe")
def step(n: int) -> dict[str, Any]:
    """One small step.

    Args:
        n: The step number.
    """
    return {"step": n}


def stepper(steps: int) -> ScriptedClient:
    """A model that calls ``step`` ``steps`` times in a row (one call per iteration), then answers."""

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        done = sum(1 for m in request.messages if m["role"] == "tool")
        if done < steps:
            return call_tools(("step", {"n": done + 1}))
        return turnkit.Result.build(text=f"{done} steps")

    return ScriptedClient(script)


@pytest.mark.usefixtures("through_lanes")
async def test_a_lane_that_is_never_idle_continues_as_new_and_runs_every_turn_in_order(database_url: str) -> None:
    """Issue 8 item 5: 12 turns queued at once keep the lane busy past the history limit; it continues as new while
    a turn runs, carrying the queue and following the running turn, and every turn completes in FIFO order.

    Every turn goes through the lane: a turn asked after the one before it ended would otherwise start directly,
    and on a fast machine too few would reach the lane to pass its limit."""
    async with dev_server(*limits()) as server, turnkit_on(server, database_url) as tk:
        agent = turnkit.Agent("busy-lane", model="scripted", tools=[step], client=stepper(1))
        conversation = await tk.conversation(agent)
        turns = [await conversation.ask(f"question {i}", wait=False) for i in range(12)]
        done = await asyncio.gather(*(turn.result(timeout=120) for turn in turns))

        assert [t.status for t in done] == ["completed"] * 12
        for earlier, later in pairwise(t.record for t in done):
            assert earlier.completed_at is not None and later.started_at is not None
            assert earlier.completed_at <= later.started_at, "two turns of one conversation overlapped"

        # Visibility is eventually consistent: wait until it shows the lane's current run as the one running run.
        async def visible() -> bool:
            current = (await tk.client.get_workflow_handle(conversation.id).describe()).run_id
            listed = [e async for e in tk.client.list_workflows(f"WorkflowId = '{conversation.id}'")]
            running = [e.run_id for e in listed if e.status is None or e.status.name == "RUNNING"]
            return running == [current]

        await eventually(visible, timeout=30, what="the lane's current run in visibility")
        runs = await runs_of(tk.client, conversation.id)
        assert len(runs) >= 2 and set(runs[:-1]) == {"CONTINUED_AS_NEW"}, runs
        assert runs[-1] == "RUNNING"
        # At least one rollover happened while a turn ran: a run started by continue-as-new follows a carried turn.
        busy_rollovers = 0
        async for execution in tk.client.list_workflows(f"WorkflowId = '{conversation.id}'"):
            history = await tk.client.get_workflow_handle(conversation.id, run_id=execution.run_id).fetch_history()
            events = list(history.events)
            busy_rollovers += carried_turn(events) is not None
            # No run records a patch marker (the first, and every one its predecessor started).
            assert patch_markers(events) == [], execution.run_id
        assert busy_rollovers >= 1
        assert await replay_closed_runs(tk.client, conversation.id) == len(runs) - 1  # the rollover paths replay


async def test_a_long_turn_continues_as_new_and_completes(database_url: str) -> None:
    """Issue 8 item 5: a turn of 30 iterations (one tool call each) passes the history limit by continuing as new."""
    async with dev_server(*limits()) as server, turnkit_on(server, database_url) as tk:
        client = stepper(30)
        agent = turnkit.Agent("long-turn", model="scripted", tools=[step], client=client, max_iterations=40)
        conversation = await tk.conversation(agent)
        turn = await conversation.ask("go", wait=False)
        done = await turn.result(timeout=180)

        assert done.status == "completed" and done.output_text == "30 steps", done.error
        executions = await done.tool_executions()
        assert [e.arguments["n"] for e in executions] == list(range(1, 31))  # each step ran once, in order
        assert all(e.status == "completed" for e in executions)
        assert client.calls == 31  # no model call repeated across runs
        runs = await runs_of(tk.client, turn.id)
        assert len(runs) >= 3 and set(runs[:-1]) == {"CONTINUED_AS_NEW"} and runs[-1] == "COMPLETED", runs
        assert await replay_closed_runs(tk.client, turn.id) == len(runs)
        async for execution in tk.client.list_workflows(f"WorkflowId = '{turn.id}'"):
            events = (await tk.client.get_workflow_handle(turn.id, run_id=execution.run_id).fetch_history()).events
            assert patch_markers(events) == [], execution.run_id


async def test_a_terminated_turn_is_recorded_failed_and_the_lane_runs_the_next(tk: TurnKit) -> None:
    """Issue 8 item 5: a turn workflow terminated by hand gets a terminal ``failed`` record (its open tool call
    ``interrupted``), ``ask()`` returns that record, and the lane runs the next queued turn."""
    gate = Gate()
    slow = gated_tool(gate)

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"] == "slow":
            return call_tools(("slow", {}))
        return turnkit.Result.build(text=f"answered {last['content']}")

    conversation = await tk.conversation(
        turnkit.Agent("terminated", model="scripted", tools=[slow], client=ScriptedClient(script))
    )
    asking = asyncio.create_task(conversation.ask("slow"))
    await asyncio.wait_for(gate.entered.wait(), 30)
    [first] = await conversation.turns()
    second = await conversation.ask("next", wait=False)
    await tk.client.get_workflow_handle(first.id).terminate("operator")
    try:
        asked = await asyncio.wait_for(asking, 60)
        assert asked.id == first.id and asked.status == "failed"
        assert asked.error == {"class": "TurnKit::Error", "message": "turn workflow terminated"}
        [execution] = await asked.tool_executions()
        assert execution.status == "interrupted"
        done = await second.result(timeout=60)
        assert done.status == "completed" and done.output_text == "answered next"
        assert asked.record.completed_at is not None and done.record.started_at is not None
        assert asked.record.completed_at <= done.record.started_at
    finally:
        gate.opened.set()


async def test_result_records_a_turn_whose_workflow_was_terminated_outside_a_lane(tk: TurnKit) -> None:
    """Issue 8 item 5: a sub-agent's turn (run by its parent, not a lane) terminated by hand is recorded ``failed``
    (by its parent, or by a caller of ``Turn.result()``, whichever sees it first); the parent goes on."""
    gate = Gate()
    slow = gated_tool(gate)
    child_client = ScriptedClient([call_tools(("slow", {})), "never"])
    child = turnkit.Agent("worker_bee", model="scripted", tools=[slow], client=child_client)
    lead_client = ScriptedClient([call_tools(("worker_bee", {"task": "dig"})), "ok"])
    lead = turnkit.Agent("queen", model="scripted", sub_agents=[child], client=lead_client)
    turn = await (await tk.conversation(lead)).ask("go", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)

    async def child_id() -> str | None:
        tree = await tk.store.list_turns(root_turn_id=turn.id)
        return next((t.id for t in tree if t.id != turn.id), None)

    await eventually(lambda: _is_set(child_id), what="the sub-agent's turn")
    sub = await child_id()
    assert sub is not None
    await tk.client.get_workflow_handle(sub).terminate("operator")
    try:
        ended = await tk.turn(sub).result(timeout=60)
        assert ended.status == "failed" and ended.error == {
            "class": "TurnKit::Error",
            "message": "turn workflow terminated",
        }
        assert (await turn.result(timeout=60)).status == "completed"
    finally:
        gate.opened.set()


async def _is_set(get: Any) -> bool:
    return await get() is not None


async def test_result_records_a_launched_turn_whose_workflow_was_terminated(tk: TurnKit) -> None:
    """Issue 8 item 5: ``Turn.result()`` never returns a non-terminal record: a launched agent's turn (abandoned by
    its parent, followed by no lane) terminated by hand is recorded ``failed`` by the caller waiting for it, and its
    completion callback is delivered."""
    gate = Gate()
    helper = turnkit.Agent(
        "helper", model="scripted", tools=[gated_tool(gate)], client=ScriptedClient([call_tools(("slow", {})), "x"])
    )
    launch = call_tools(("launch_agent", {"agent_name": "helper", "task": "help", "callback": True}))
    launcher = turnkit.Agent(
        "launcher",
        model="scripted",
        tools=[launch_agent],
        sub_agents=[helper],
        client=ScriptedClient([launch, "launched", "got the callback"]),
    )
    conversation = await tk.conversation(launcher)
    turn = await conversation.ask("start")
    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.result is not None, (execution.status, execution.error, execution.result)
    launched = tk.turn(execution.result["turn_id"])
    await asyncio.wait_for(gate.entered.wait(), 30)
    await tk.client.get_workflow_handle(launched.id).terminate("operator")
    try:
        ended = await launched.result(timeout=60)
        assert ended.status == "failed"
        assert ended.error == {"class": "TurnKit::Error", "message": "turn workflow terminated"}

        async def called_back() -> bool:
            turns = await conversation.turns()
            return len(turns) == 2 and all(t.record.terminal for t in turns)

        await eventually(called_back, what="the completion callback to wake the launcher's conversation")
    finally:
        gate.opened.set()


async def test_a_turn_waits_for_a_child_it_launched_before_continuing_as_new(database_url: str) -> None:
    """Issue 8 item 5: a turn launches a helper, runs past the history limit (continuing as new), then ``wait_for``s
    the helper: the new run cannot await it as a child, and waits for it through its wait row and end signal."""
    gate = Gate()
    helper = turnkit.Agent(
        "helper", model="scripted", tools=[gated_tool(gate)], client=ScriptedClient([call_tools(("slow", {})), "hi"])
    )

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        results = [m for m in request.messages if m["role"] == "tool"]
        if not results:
            return call_tools(("launch_agent", {"agent_name": "helper", "task": "help"}))
        if len(results) <= 20:
            return call_tools(("step", {"n": len(results)}))
        if len(results) == 21:
            launched = json.loads(str(results[0]["content"]))["turn_id"]
            return call_tools(("wait_for", {"turn_ids": [launched]}))
        return turnkit.Result.build(text=str(results[-1]["content"]))

    launcher = turnkit.Agent(
        "launcher",
        model="scripted",
        tools=[launch_agent, wait_for, step],
        sub_agents=[helper],
        client=ScriptedClient(script),
        max_iterations=40,
    )
    async with dev_server(*limits()) as server, turnkit_on(server, database_url) as tk:
        turn = await (await tk.conversation(launcher)).ask("go", wait=False)
        try:
            await asyncio.wait_for(gate.entered.wait(), 30)

            async def waiting_after_rollover() -> bool:
                return (await turn.refresh()).status == "waiting" and len(await runs_of(tk.client, turn.id)) >= 2

            await eventually(waiting_after_rollover, timeout=60, what="the launcher to wait, after continuing as new")
        finally:
            gate.opened.set()
        done = await turn.result(timeout=120)
        assert done.status == "completed", done.error
        waited = [e for e in await done.tool_executions() if e.tool_name == "wait_for"]
        assert [e.status for e in waited] == ["completed"]
        assert "hi" in done.output_text  # the helper's result, as wait_for returned it
        assert await replay_closed_runs(tk.client, turn.id) >= 2
