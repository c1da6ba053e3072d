"""Human controls on a real Temporal dev server: pause, resume, steer, cancel (behaviour §5.9, §5.10)."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import uuid
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.testing import ActivityEnvironment

import turnkit
from tests.engine import (
    Engine,
    Gate,
    HeldModel,
    eventually,
    gated_tool,
    held_tool,
    lane_buffers,
    running_turn_record,
    turn_for_activities,
)
from tests.request_client import start_client
from turnkit._activities.turns import TurnActivities
from turnkit._engine.client_requests import cancel_workflow_id
from turnkit.handles import Turn
from turnkit.kernel.payloads import FinishTurn
from turnkit.kernel.requests import CancelPlan
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool
def other() -> dict[str, Any]:
    """Another tool."""
    return {"other": True}


async def test_steering_mid_tool_loop(tk: TurnKit) -> None:
    gate = Gate()
    client = ScriptedClient([call_tools(("slow", {}), ("other", {})), "steered answer"])
    agent = turnkit.Agent("steerable", model="scripted", tools=[gated_tool(gate), other], client=client)
    turn = await (await tk.conversation(agent)).ask("start", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)

    [receipt] = await turn.steer("focus on debt", key="s-1", principal="human")
    assert "message_id" not in receipt  # queued
    assert await turn.steer("focus on debt", key="s-1", principal="human") == [receipt]  # idempotent
    with pytest.raises(turnkit.ToolError, match="steering key is already used for a different input"):
        await turn.steer("something else", key="s-1", principal="human")
    gate.opened.set()
    done = await turn.result(timeout=60)

    assert done.status == "completed" and done.output_text == "steered answer"
    executions = await done.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [("slow", "completed"), ("other", "cancelled")]
    assert executions[1].result == {"skipped": True, "message": "not executed: superseded by human steering"}
    tail = [(m["role"], m["content"]) for m in client.requests[1].messages[-3:]]
    assert tail[0] == ("tool", json.dumps({"done": True}))
    assert tail[1] == ("tool", json.dumps({"message": "not executed: superseded by human steering", "skipped": True}))
    assert tail[2] == ("user", "focus on debt")
    [applied] = (await done.control_state())["controls"]["inputs"]
    assert applied["message_id"] and applied["request_id"] == client.requests[1].metadata["request_id"]
    assert gate.runs == 1


async def test_cancel_during_a_local_tool_call(tk: TurnKit) -> None:
    """A turn cancelled while a ``@tool(local=True)`` call runs inside its workflow task: the record is cancelled at
    once; the workflow hears of it at the task's next heartbeat (the call holds the task), cancels the call and
    ends, and the call records no result; the conversation's next turn runs."""
    gate = Gate()
    client = ScriptedClient([call_tools(("slow", {})), "next answer"])
    agent = turnkit.Agent("local_cancel", model="scripted", tools=[gated_tool(gate, local=True)], client=client)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("start", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)

    cancelled = await turn.cancel()
    assert cancelled.status == "cancelled"
    ended = await turn.result(timeout=60)  # the workflow's end: within a task heartbeat (~8 s), not the tool's end
    assert ended.status == "cancelled"

    async def closed() -> bool:
        described = await tk.client.get_workflow_handle(turn.id).describe()
        return described.status is not None and described.status.name != "RUNNING"

    await eventually(closed, timeout=30, what="the turn's workflow to close while the tool is still held")
    assert not gate.opened.is_set() and gate.runs == 1
    [execution] = await turn.tool_executions()
    assert execution.status != "completed" and execution.result is None
    following = await conversation.ask("again")
    assert (following.status, following.output_text) == ("completed", "next answer"), following.error
    assert client.calls == 2


async def test_pause_during_a_long_tool_then_resume(tk: TurnKit) -> None:
    gate = Gate()
    client = ScriptedClient([call_tools(("slow", {})), "resumed answer"])
    agent = turnkit.Agent("pausable", model="scripted", tools=[gated_tool(gate)], client=client)
    turn = await (await tk.conversation(agent)).ask("start", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)

    paused = await turn.pause()
    assert paused.status == "running" and paused.record.options.controls_or_default.pause_requested is True
    gate.opened.set()

    async def acknowledged() -> bool:
        return (await turn.refresh()).status == "paused"

    await eventually(acknowledged, what="the pause to be acknowledged at the next boundary")
    [execution] = await turn.tool_executions()
    assert execution.status == "completed"  # the tool finished and was recorded
    assert client.calls == 1  # nothing else ran

    await turn.resume()
    await turn.resume()  # repeating resume is safe
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "resumed answer"
    assert gate.runs == 1 and client.calls == 2


async def test_pause_while_the_model_answers_keeps_the_answer(tk: TurnKit) -> None:
    """T84: paused with a model call in flight, the turn stays ``running`` with ``pause_requested``; once the
    answer is back it is ``paused`` with no claim token, phase "output" and no output; reconcile changes nothing;
    two resumes complete it with "kept" after 1 model call and 1 iteration."""
    since = utcnow()
    model = HeldModel(turnkit.Result.build(text="kept"))
    agent = turnkit.Agent("thinker", model="scripted", client=model)
    turn = await (await tk.conversation(agent)).ask("think", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)
    paused = await turn.pause()
    assert paused.status == "running" and paused.record.options.controls_or_default.pause_requested
    model.released.set()
    await eventually(lambda: _status_is(turn, "paused"), what="the turn to pause before publishing")
    assert turn.output_text == "" and turn.record.options.state.phase == "output"
    assert turn.record.claim_token is None
    await tk.reconcile(since=since, grace=0)
    still = await turn.refresh()
    assert (still.status, still.output_text, still.record.options.state.phase) == ("paused", "", "output")
    assert len(model.requests) == 1
    await turn.resume()
    await turn.resume()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "kept"
    assert len(model.requests) == 1 and done.record.options.state.iterations == 1


async def test_approval_gate_blocks_the_conversation_until_resumed(tk: TurnKit) -> None:
    client = ScriptedClient(lambda request: turnkit.Result.build(text=f"answer {len(request.messages)}"))
    conversation = await tk.conversation(turnkit.Agent("gated", model="scripted", client=client))
    gated = await conversation.ask("needs approval", paused=True)
    assert gated.status == "paused"
    posted = await conversation.post("later input", key=f"later-{conversation.id}")
    await eventually(lambda: lane_buffers(tk, conversation.id, posted.id), what="the lane to hold the post")
    assert len(await conversation.turns()) == 1  # the paused turn blocks its lane: no new turn starts
    assert (await conversation.input_status(posted.id))["status"] == "pending"
    assert client.calls == 0
    await gated.resume()
    done = await gated.result(timeout=60)
    assert done.status == "completed"

    async def both_done() -> bool:
        turns = await conversation.turns()
        return len(turns) == 2 and all(t.record.terminal for t in turns)

    await eventually(both_done, what="the delivery's turn after resume")
    assert client.calls == 2
    assert not any("later input" in m["content"] for m in client.requests[0].messages)
    assert any("later input" in m["content"] for m in client.requests[1].messages)


async def test_a_pending_run_paused_then_posted_to_stays_paused_until_resumed(engine: Engine) -> None:
    """T86: a submitted run still ``pending`` (its task queue has no worker yet) is paused; a ``post`` to its
    conversation, then a reconcile, change nothing: the run stays ``paused``, the model was never called, no new turn
    exists and the input is ``pending``. Once resumed (and served): 2 model calls, and "later" only in the second."""
    since = utcnow()
    tk = TurnKit(engine.tk.client, engine.tk.store, task_queue=f"t86-{uuid.uuid4().hex[:8]}")
    client = ScriptedClient(lambda request: turnkit.Result.build(text=f"answer {len(request.messages)}"))
    run = await tk.run(turnkit.Agent("t86", model="scripted", client=client), "first task", wait=False)
    assert run.status == "pending"
    assert (await run.pause()).status == "paused"  # not running: paused at once
    conversation = await tk.load_conversation(run.record.conversation_id)
    posted = await conversation.post("later", key=f"later-{conversation.id}")
    await tk.reconcile(since=since, grace=0)

    assert (await run.refresh()).status == "paused" and client.calls == 0
    assert [t.id for t in await conversation.turns()] == [run.id]
    assert (await conversation.input_status(posted.id))["status"] == "pending"

    async with tk.worker():
        await run.resume()
        assert (await run.result(timeout=60)).status == "completed"

        async def both_done() -> bool:
            turns = await conversation.turns()
            return len(turns) == 2 and all(t.record.terminal for t in turns)

        await eventually(both_done, what="the post's turn after the resume")
    assert client.calls == 2
    assert not any("later" in m["content"] for m in client.requests[0].messages)
    assert client.requests[1].messages[-1]["content"].endswith("later")


async def test_cancel_with_descendants_during_parallel_delegation(tk: TurnKit) -> None:
    turnkit.configure(tool_heartbeat_timeout=1.0)  # cancellation reaches a running tool through its heartbeat
    gate = Gate()
    children = [
        turnkit.Agent(
            name,
            model="scripted",
            tools=[gated_tool(gate)],
            client=ScriptedClient(
                lambda r: (
                    call_tools(("slow", {})) if r.messages[-1]["role"] == "user" else turnkit.Result.build(text="x")
                )
            ),
        )
        for name in ("left", "right")
    ]
    client = ScriptedClient([call_tools(("left", {"task": "l"}), ("right", {"task": "r"})), "never"])
    boss = turnkit.Agent("boss", model="scripted", sub_agents=children, client=client)
    turn = await (await tk.conversation(boss)).ask("split", wait=False)

    async def both_children_working() -> bool:
        return gate.runs == 2

    await eventually(both_children_working, what="both children inside their tools")
    await turn.cancel(descendants="cascade")
    tree = await tk.store.list_turns(root_turn_id=turn.id)
    assert len(tree) == 3 and {t.status for t in tree} == {"cancelled"}
    assert all(t.error == {"class": "TurnKit::Cancelled", "message": "cancelled by application"} for t in tree)

    async def workflows_closed() -> bool:
        for record in tree:
            description = await tk.client.get_workflow_handle(record.id).describe()
            if description.status is None or description.status.name == "RUNNING":
                return False
        return True

    await eventually(workflows_closed, timeout=30, what="every turn workflow to end")
    executions = await tk.store.list_tool_executions(root_turn_id=turn.id)
    gate.opened.set()
    assert client.calls == 1  # nothing new started after the cancel
    assert {e.status for e in executions if e.tool_name == "slow"} == {"interrupted"}
    assert len(await tk.store.list_tool_executions(root_turn_id=turn.id)) == len(executions)
    # Cancel wins: resume and pause change nothing now.
    await turn.resume()
    await turn.pause()
    assert (await turn.refresh()).status == "cancelled"


async def test_steering_a_finished_turn(tk: TurnKit) -> None:
    client = ScriptedClient(["done"])
    turn = await (await tk.conversation(turnkit.Agent("quick", model="scripted", client=client))).ask("hi")
    with pytest.raises(turnkit.Error, match="cannot steer a completed turn; post next-turn input instead"):
        await turn.steer("too late", key="k")
    with pytest.raises(ValueError, match="descendants must be"):
        await turn.pause(descendants="everything")


async def _status_is(turn: turnkit.Turn, status: str) -> bool:
    return (await turn.refresh()).status == status


async def _status_in(turn: turnkit.Turn, *statuses: str) -> bool:
    return (await turn.refresh()).status in statuses


async def test_steering_while_the_answer_is_written_is_applied_before_publishing(tk: TurnKit) -> None:
    model = HeldModel(turnkit.Result.build(text="first draft"), then="revised")
    turn = await (await tk.conversation(turnkit.Agent("writer", model="scripted", client=model))).ask(
        "write", wait=False
    )
    await asyncio.wait_for(model.entered.wait(), 30)
    await turn.steer("revise before publishing", key="r1")
    model.released.set()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "revised"  # the first draft was never published
    assert len(model.requests) == 2
    assert model.requests[1].messages[-1] == {"role": "user", "content": "revise before publishing"}


async def test_pause_and_steer_during_a_tool_with_another_queued(tk: TurnKit) -> None:
    """T85: pause and steer while tool A runs with B queued: A's result is committed and the turn is ``paused`` with
    B never run; resumed, it completes with statuses ``[completed, cancelled]`` and A's result seen by the model."""
    gate = Gate()
    client = ScriptedClient([call_tools(("slow", {}), ("other", {})), "after both"])
    agent = turnkit.Agent("both", model="scripted", tools=[gated_tool(gate), other], client=client)
    turn = await (await tk.conversation(agent)).ask("start", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    await turn.pause()
    await turn.steer("use filings", key="s")
    gate.opened.set()
    await eventually(lambda: _status_is(turn, "paused"), what="the pause at the boundary before the queued call")
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [("slow", "completed")]  # the queued call never ran
    assert client.calls == 1
    await turn.resume()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "after both"
    assert [e.status for e in await done.tool_executions()] == ["completed", "cancelled"]
    assert client.requests[1].messages[-1] == {"role": "user", "content": "use filings"}
    assert '"done": true' in client.requests[1].messages[-3]["content"]  # the first tool's result is kept


async def test_pause_while_a_terminal_tool_runs_holds_its_answer(tk: TurnKit) -> None:
    """Behaviour §3.2 phase output, §5.10: a pause requested while a terminal tool runs is acknowledged before its
    answer is published: paused, no output, no claim, the completion message held (phase output); resumed, the turn
    completes with it and the model is not asked again."""
    gate = Gate()
    client = ScriptedClient([call_tools(("file", {}), ("other", {}))])
    agent = turnkit.Agent(
        "filer", model="scripted", tools=[gated_tool(gate, "file", terminal="Filed."), other], client=client
    )
    turn = await (await tk.conversation(agent)).ask("file it", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    await turn.pause()
    gate.opened.set()
    await eventually(lambda: _status_in(turn, "paused", "completed"), what="the terminal tool's answer to settle")
    assert turn.status == "paused"  # not completed: the pause comes before publication
    state = turn.record.options.state
    assert (turn.output_text, turn.record.claim_token) == ("", None)
    assert (state.phase, state.candidate, state.terminal_tool_name) == ("output", "Filed.", "file")
    assert [e.status for e in await turn.tool_executions()] == ["completed", "cancelled"]  # still skipped
    await turn.resume()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "Filed."
    assert client.calls == 1 and done.record.options.state.iterations == 1
    assert [m.text for m in await done.messages() if m.role == "assistant" and m.kind == "text"] == ["Filed."]


async def test_steering_while_a_terminal_tool_runs_is_applied_before_its_answer(tk: TurnKit) -> None:
    """Behaviour §5.10 (the boundary inside complete_with_output): steering queued while a terminal tool runs
    supersedes its answer, which is never published: the model is asked again with the steering input last."""
    gate = Gate()
    client = ScriptedClient([call_tools(("file", {})), "filed with the appendix"])
    agent = turnkit.Agent(
        "steered_filer", model="scripted", tools=[gated_tool(gate, "file", terminal="Filed.")], client=client
    )
    turn = await (await tk.conversation(agent)).ask("file it", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    await turn.steer("add the appendix", key="s1")
    gate.opened.set()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "filed with the appendix"
    assert client.calls == 2
    assert client.requests[1].messages[-2:] == [
        {"role": "assistant", "content": "Filed."},
        {"role": "user", "content": "add the appendix"},
    ]
    assert done.record.options.state.terminal_tool_name is None


async def test_a_retried_terminal_finish_at_a_pause_holds_the_answer_once(engine: Engine) -> None:
    """turnkit.finish_turn retried after it held a terminal answer at a pause: the retry reports the pause again and
    appends no second completion message (keyed by the execution id, like the audit)."""
    tk = engine.tk
    agent = turnkit.Agent("held_filer", model="scripted", tools=[gated_tool(Gate(), "file", terminal="Filed.")])
    turnkit.register(agent)
    conversation = await tk.conversation(agent)
    record = await turn_for_activities(tk, conversation, "file it", status="running")
    async with tk.store.atomic() as tx:
        execution, _ = await tx.create_tool_execution(
            turn_id=record.id, tool_call_id="call_1", tool_name="file", arguments={}, status="completed", result={}
        )
    await tk.turn(record.id).pause()
    finish = FinishTurn(turn_id=record.id, status="completed", terminal_execution_id=execution.id)
    env = ActivityEnvironment()
    first = await env.run(TurnActivities(tk.store).finish_turn, finish)
    again = await env.run(TurnActivities(tk.store).finish_turn, finish)  # the retry, after the commit
    assert first.boundary == again.boundary == "paused"
    assert [m.text for m in await conversation.messages() if m.role == "assistant"] == ["Filed."]
    turn = await tk.store.load_turn(record.id)
    assert (turn.status, turn.output_text, turn.options.state.candidate) == ("paused", None, "Filed.")


@pytest.mark.parametrize("control", ["pause", "steer"])
async def test_controls_apply_before_a_child_is_created(tk: TurnKit, control: str) -> None:
    gate = Gate()
    helper_client = ScriptedClient(["helped"])
    helper = turnkit.Agent("helper", model="scripted", client=helper_client)
    client = ScriptedClient([call_tools(("slow", {}), ("helper", {"task": "help"})), "done"])
    boss = turnkit.Agent("boss", model="scripted", tools=[gated_tool(gate)], sub_agents=[helper], client=client)
    turn = await (await tk.conversation(boss)).ask("go", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    if control == "pause":
        await turn.pause()
    else:
        await turn.steer("skip the helper", key="s")
    gate.opened.set()
    if control == "pause":
        await eventually(lambda: _status_is(turn, "paused"), what="the pause before delegation")
        assert len(await tk.store.list_turns(root_turn_id=turn.id)) == 1  # no child yet
        await turn.resume()
    done = await turn.result(timeout=60)
    assert done.status == "completed"
    children = len(await tk.store.list_turns(root_turn_id=turn.id)) - 1
    statuses = [e.status for e in await done.tool_executions()]
    if control == "pause":
        assert children == 1 and helper_client.calls == 1 and statuses == ["completed", "completed"]
    else:
        assert children == 0 and helper_client.calls == 0 and statuses == ["completed", "cancelled"]


async def test_steering_past_the_iteration_budget_fails_the_turn(tk: TurnKit) -> None:
    """T96: ``max_iterations=1`` and a pause acknowledged once the model call completed; steered and resumed, the
    turn fails "maximum iterations reached", keeps the call's 38 tokens of usage, and made 1 model call."""
    model = HeldModel(turnkit.Result.build(text="draft", usage=turnkit.Usage(input_tokens=30, output_tokens=8)))
    agent = turnkit.Agent("tight", model="scripted", client=model, max_iterations=1)
    turn = await (await tk.conversation(agent)).ask("go", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)
    await turn.pause()
    model.released.set()
    await eventually(lambda: _status_is(turn, "paused"), what="the pause after the model call")
    await turn.steer("change course", key="c")
    await turn.resume()
    done = await turn.result(timeout=60)
    assert done.status == "failed"
    assert done.error == {"class": "TurnKit::BudgetError", "message": "maximum iterations reached"}
    assert done.usage.total_tokens == 38 and len(model.requests) == 1  # the first call's usage is kept


async def test_cascade_pause_steer_resume_through_a_delegation(tk: TurnKit) -> None:
    gate = Gate()
    child_client = ScriptedClient(
        lambda r: call_tools(("slow", {})) if r.messages[-1]["role"] == "user" else turnkit.Result.build(text="kept")
    )
    child = turnkit.Agent("worker", model="scripted", tools=[gated_tool(gate)], client=child_client)
    client = ScriptedClient([call_tools(("worker", {"task": "dig"})), "final"])
    parent = turnkit.Agent("lead", model="scripted", sub_agents=[child], client=client)
    turn = await (await tk.conversation(parent)).ask("go", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)

    paused = await turn.pause(descendants="cascade")
    assert paused.status == "paused"  # a parent waiting on its child holds no claim: paused at once (behaviour §5.10)
    gate.opened.set()
    child_turn = next(t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id)
    await eventually(lambda: _status_is(tk.turn(child_turn.id), "paused"), what="the child to pause")
    receipts = await turn.steer("new focus", key="f", descendants="cascade")
    assert {r["turn_id"] for r in receipts} == {turn.id, child_turn.id}
    await turn.resume(descendants="cascade")
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "final"
    assert client.requests[-1].messages[-1] == {"role": "user", "content": "new focus"}
    assert any('"result": "kept"' in m["content"] for m in client.requests[-1].messages if m["role"] == "tool")


async def test_steering_a_model_request_in_flight_supersedes_its_proposals(tk: TurnKit) -> None:
    """T83: two steers while a model request proposing tool "old" is in flight (a repeated key returns the same
    receipt, another text under it raises ``ToolError``): "old" never runs, the next request ends with the call, its
    "superseded by human steering" result and both steers, both receipts carry its ``request_id``, and the posted
    "next only" stays pending until a different, later turn applies it as its last user message."""
    old_runs: list[int] = []

    @turnkit.tool
    def old() -> dict[str, Any]:
        """A tool the steering makes obsolete."""
        old_runs.append(1)
        return {}

    model = HeldModel(call_tools(("old", {})), then=lambda r: turnkit.Result.build(text=f"answer {len(r.messages)}"))
    conversation = await tk.conversation(turnkit.Agent("analyst", model="scripted", tools=[old], client=model))
    turn = await conversation.ask("analyse", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)

    posted = await conversation.post("next only", key=f"next-{conversation.id}")
    [first] = await turn.steer("focus on debt", key="s1")
    [second] = await turn.steer("use filings", key="s2")
    assert await turn.steer("focus on debt", key="s1") == [first]
    with pytest.raises(turnkit.ToolError, match="steering key is already used for a different input"):
        await turn.steer("something else", key="s1")
    assert (await conversation.input_status(posted.id))["status"] == "pending"
    model.released.set()

    done = await turn.result(timeout=60)
    assert done.status == "completed" and old_runs == []  # the superseded proposal never ran
    request = model.requests[1]
    tail = request.messages[-4:]
    assert tail[0]["role"] == "assistant" and [c["name"] for c in tail[0]["tool_calls"]] == ["old"]
    assert tail[1]["role"] == "tool" and "superseded by human steering" in tail[1]["content"]
    assert tail[2:] == [{"role": "user", "content": "focus on debt"}, {"role": "user", "content": "use filings"}]
    assert not any("next only" in m["content"] for m in request.messages)  # next-turn input waits its turn
    inputs = (await done.control_state())["controls"]["inputs"]
    assert [i["id"] for i in inputs] == [first["id"], second["id"]]
    assert [i["request_id"] for i in inputs] == [request.metadata["request_id"]] * 2  # both in that request

    async def applied() -> bool:  # recorded with the request (before the model is called), then sent
        status = await conversation.input_status(posted.id)
        return status["status"] == "applied" and any(
            r.metadata["request_id"] == status["application"]["request_id"] for r in model.requests
        )

    await eventually(applied, what="the posted input to reach a later turn's request")
    application = (await conversation.input_status(posted.id))["application"]
    assert application["turn_id"] != turn.id  # applied by a different, later turn
    [later] = [r for r in model.requests if r.metadata["request_id"] == application["request_id"]]
    assert [m for m in later.messages if m["role"] == "user"][-1]["content"] == "next only"


async def test_pause_steer_cancel_resume_while_the_model_answers(tk: TurnKit) -> None:
    """T98: a pause, a steer, ``cancel`` and ``resume`` while a model call is in flight leave the turn ``cancelled``
    with empty output after the release, no steering or assistant message is written, and the steer retry returns
    the same receipt."""
    model = HeldModel(turnkit.Result.build(text="too late"))
    conversation = await tk.conversation(turnkit.Agent("cancelled", model="scripted", client=model))
    turn = await conversation.ask("go", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)

    await turn.pause()
    [receipt] = await turn.steer("change course", key="c")
    cancelled = await turn.cancel()
    await turn.resume()
    assert cancelled.status == "cancelled"
    model.released.set()

    done = await turn.result(timeout=60)
    assert done.status == "cancelled" and done.output_text == ""
    messages = await conversation.messages()
    assert [m.role for m in messages] == ["user"]  # no steering and no assistant message were written
    assert await turn.steer("change course", key="c") == [receipt]  # the retry returns the same receipt
    assert len(model.requests) == 1


async def test_reconcile_during_a_paused_model_call_then_cancel_and_resume(tk: TurnKit) -> None:
    """T94: a model call in flight and a pause; reconcile repairs nothing (no claim expires here: the turn's workflow
    still owns it, so it stays ``running`` with ``pause_requested`` until the call returns, instead of the gem's
    ``paused``); ``cancel`` then ``resume`` leaves it ``cancelled``, and the late response writes nothing."""
    since = utcnow()
    model = HeldModel(turnkit.Result.build(text="too late"))
    conversation = await tk.conversation(turnkit.Agent("t94", model="scripted", client=model))
    turn = await conversation.ask("go", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)

    await turn.pause()
    reconciled = await tk.reconcile(since=since, grace=0)
    assert [r for r in reconciled.repairs if turn.id in str(r)] == []
    pausing = await turn.refresh()
    assert pausing.status == "running" and pausing.record.options.controls_or_default.pause_requested
    cancelled = await turn.cancel()
    resumed = await turn.resume()
    assert cancelled.status == "cancelled" and resumed.status == "cancelled"
    model.released.set()

    done = await turn.result(timeout=60)
    assert done.status == "cancelled" and done.output_text == ""
    assert [m.role for m in await conversation.messages()] == ["user"], "T94: the late response writes nothing"
    assert done.usage.total_tokens == 0 and len(model.requests) == 1


async def test_a_paused_waiting_parent_fails_at_its_deadline(tk: TurnKit) -> None:
    """T88: a paused waiting parent whose child is also paused and steered, resumed after the timeout passed, is
    ``failed`` "turn timed out" with ``submitted_at`` unchanged; until the resume it stays ``paused`` past its
    deadline (§5.13 invariant 11: only resume or cancel end a pause)."""
    gate = Gate()
    child_client = ScriptedClient(
        lambda r: call_tools(("slow", {})) if r.messages[-1]["role"] == "user" else turnkit.Result.build(text="late")
    )
    child = turnkit.Agent("digger", model="scripted", tools=[gated_tool(gate)], client=child_client)
    parent = turnkit.Agent(
        "deadline",
        model="scripted",
        sub_agents=[child],
        timeout=3,  # seconds from submission; time spent paused counts
        client=ScriptedClient([call_tools(("digger", {"task": "dig"})), "never"]),
    )
    turn = await (await tk.conversation(parent)).ask("go", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    submitted_at = (await turn.refresh()).record.submitted_at

    assert (await turn.pause(descendants="cascade")).status == "paused"
    [child_turn] = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    await tk.turn(child_turn.id).steer("dig deeper", key="d")

    async def past_the_deadline() -> bool:  # the workflow's deadline fired and found the turn paused
        metadata = await tk.client.get_workflow_handle(turn.id).query(
            "__temporal_workflow_metadata", result_type=WorkflowMetadata
        )
        return "paused past the deadline" in metadata.current_details

    await eventually(past_the_deadline, timeout=30, what="the root deadline to pass while paused")
    assert (await turn.refresh()).status == "paused"
    await turn.resume(descendants="cascade")
    gate.opened.set()
    done = await turn.result(timeout=60)
    assert done.status == "failed"
    assert done.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert done.record.submitted_at == submitted_at


@dataclass
class _BusyTree:
    """A lead's root turn waiting for its sub-agent, whose turn holds in a tool; the lead's next turn queued behind
    the root; a turn of another conversation waiting for the root."""

    root: Turn
    release: asyncio.Event  #: lets the sub-agent's tool finish
    queued: Turn
    waiter: Turn


async def _busy_tree(tk: TurnKit, suffix: str = "") -> _BusyTree:
    release, hold = held_tool()
    helper = turnkit.Agent(
        f"cancel_helper{suffix}",
        model="scripted",
        tools=[hold],
        client=ScriptedClient(lambda r: call_tools(("hold", {})) if r.messages[-1]["role"] == "user" else "held"),
    )

    def lead_script(request: turnkit.ModelRequest) -> turnkit.Result | str:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"] == "start":
            return call_tools((helper.name, {"task": "hold on"}))
        return f"answered {last['content']}" if last["role"] == "user" else "lead done"

    client = ScriptedClient(lead_script)
    lead = turnkit.Agent(f"cancel_lead{suffix}", model="scripted", sub_agents=[helper], client=client)
    conversation = await tk.conversation(lead)
    root = await conversation.ask("start", wait=False)

    async def helper_running() -> bool:
        tree = await tk.store.list_turns(root_turn_id=root.id)
        return [t.status for t in tree] == ["waiting", "running"]  # the lead waits for its sub-agent

    await eventually(helper_running, what="the sub-agent's turn inside its tool")
    queued = await conversation.ask("next", wait=False)
    waiter = await (await tk.conversation(lead)).ask("after the root", wait=False, wait_for=[root.id])
    return _BusyTree(root=root, release=release, queued=queued, waiter=waiter)


async def _all_of_the_cancel(tk: TurnKit, tree: _BusyTree, *, helper_may_finish_first: bool = False) -> None:
    """Everything a cascading cancel of ``tree.root`` does has happened: its workflow's plan names every turn of the
    tree, all ``cancelled``; their workflows end; the waiter and the queued turn run.

    With ``helper_may_finish_first`` the sub-agent's tool was let go while the cancel was on its way, so the
    sub-agent's turn may have completed before the cancel's write: a finished turn is not cancelled, and the plan
    names the rest."""
    handle = tk.client.get_workflow_handle(cancel_workflow_id(tree.root.id, "cascade", None), result_type=CancelPlan)
    plan = await handle.result()
    turns = await tk.store.list_turns(root_turn_id=tree.root.id)
    if helper_may_finish_first:
        assert turns[0].id == tree.root.id and turns[0].status == "cancelled"
        assert {t.status for t in turns[1:]} <= {"cancelled", "completed"}
        turns = [t for t in turns if t.status == "cancelled"]
    assert plan.turn_ids == [t.id for t in turns] and {t.status for t in turns} == {"cancelled"}

    async def workflows_closed() -> bool:
        for record in turns:
            description = await tk.client.get_workflow_handle(record.id).describe()
            if description.status is None or description.status.name == "RUNNING":
                return False
        return True

    await eventually(workflows_closed, what="every cancelled turn's workflow to end")
    assert (await tree.queued.result(timeout=60)).output_text == "answered next"
    waited = await tree.waiter.result(timeout=60)
    assert waited.status == "completed", waited.error


async def test_a_cancel_is_one_durable_request_that_outlives_its_client(tk: TurnKit, engine: Engine) -> None:
    """``Turn.cancel(descendants="cascade")`` from a client process SIGKILLed in the middle of it (while the worker
    asks the authorization hook about the first selected turn): the cancel workflow carries the whole request out
    without the client and without an operator. The root and its running sub-agent's turn end ``cancelled``, their
    workflows end, the turn of another conversation that waits for the root goes on, and the conversation's next
    turn runs. The client is gone before any of it was written: all of it happened after it died. Both steps ran as
    local activities of the cancel workflow."""
    # Cancellation reaches the running tool through its heartbeat, which the SDK sends every 0.8 timeout: 3 s keeps
    # the cancel prompt and leaves the beat 0.6 s of slack while the client process starts (1 s left 0.2 s, and a
    # loaded 2-core machine once let the tool time out, so that the tree completed before the cancel was asked).
    turnkit.configure(tool_heartbeat_timeout=3.0)
    asked, answer = asyncio.Event(), asyncio.Event()

    async def hook(action: str, principal: Any = None, **resources: Any) -> bool:
        if action == "cancel" and not asked.is_set():
            asked.set()
            await answer.wait()  # the client is killed while the cancel's first step waits here
        return True

    turnkit.configure(authorize=hook)
    tree = await _busy_tree(tk)
    client = await start_client(engine, "cancel", tree.root.id)
    await asyncio.wait_for(asked.wait(), 30)
    assert [t.status for t in await tk.store.list_turns(root_turn_id=tree.root.id)] == ["waiting", "running"]
    client.send_signal(signal.SIGKILL)
    assert await client.wait() == -signal.SIGKILL
    answer.set()

    await _all_of_the_cancel(tk, tree)
    tree.release.set()
    assert {t.status for t in await tk.store.list_turns(root_turn_id=tree.root.id)} == {"cancelled"}
    handle = tk.client.get_workflow_handle(cancel_workflow_id(tree.root.id, "cascade", None))
    events = (await handle.fetch_history()).events
    assert not [e for e in events if e.HasField("activity_task_scheduled_event_attributes")]
    assert [e.marker_recorded_event_attributes.marker_name for e in events].count("core_local_activity") == 2


@pytest.mark.parametrize("seed", range(6))
async def test_a_client_killed_at_any_moment_of_a_cancel_leaves_none_or_all_of_it(
    tk: TurnKit, engine: Engine, seed: int
) -> None:
    """The client process that asks for a cascading cancel is SIGKILLed at a moment drawn from ``seed``, 0 to 6 ms
    after it was told to go: before its request left it, or after (on a 2-core machine the seeds hit both; which one
    each hits depends on the machine, and the outcome must not). Then the sub-agent's tool is let go, and the tree
    runs to its end with no operator. Either the cancel happened in full (every turn of the tree not finished by
    then ``cancelled`` by the cancel workflow, their workflows ended, the waiting turn and the queued one run; the
    sub-agent's turn may have completed first, as the tool was let go while the request was on its way) or not at
    all (no turn of the tree is ``cancelled``: the root completes as if nobody had asked)."""
    turnkit.configure(tool_heartbeat_timeout=1.0)
    tree = await _busy_tree(tk, f"_{seed}")
    client = await start_client(engine, "cancel", tree.root.id)
    await asyncio.sleep(random.Random(seed).uniform(0.0, 0.006))  # the fault's moment, not a wait for a state
    with suppress(ProcessLookupError):  # it may have finished its request already
        client.send_signal(signal.SIGKILL)
    await client.wait()
    tree.release.set()

    root = await tree.root.result(timeout=60)
    if root.status == "cancelled":
        await _all_of_the_cancel(tk, tree, helper_may_finish_first=True)
    else:
        assert root.status == "completed" and root.output_text == "lead done", root.error
        assert "cancelled" not in {t.status for t in await tk.store.list_turns(root_turn_id=tree.root.id)}
        assert (await tree.queued.result(timeout=60)).output_text == "answered next"
        assert (await tree.waiter.result(timeout=60)).status == "completed"


def test_a_turns_state_and_controls_are_copied_to_change_as_a_deep_copy_would() -> None:
    """``TurnRecord.state`` and ``controls_of`` hand out copies to change and write back: each is what
    ``model_copy(deep=True)`` gives (values, fields set, extra keys), and changing any list, dict or nested model in
    it, at any depth, leaves the record as it was."""
    from turnkit._engine.controls import controls_of
    from turnkit.kernel.turn_state import SteeringInput, TurnControls, TurnOptions, TurnState

    steering = SteeringInput(id="s1", key="k", text="go", turn_id="turn_x", sequence=3, later={"a": [1]})  # type: ignore[call-arg]
    state = TurnState.model_validate(
        {
            "iterations": 2,
            "phase": "tools",
            "output_data": {"rows": [{"n": 1}], "ok": True},
            "delivery_requests": {"delivery_1": "message_1"},
            "judge_answers": [{"policy": "p", "usage": {"input_tokens": 3}}],
            "mcp_tools": {"files": [{"name": "read", "parameters": {"type": "object"}}]},
            "loaded_skills": ["a"],
            "newer_release_key": {"nested": [1, {"x": 2}]},
        }
    )
    controls = TurnControls(pause_requested=True, inputs=[steering])
    record = running_turn_record(TurnOptions(state=state, controls=controls))
    before = record.model_dump(mode="json")
    for copied, original in ((record.state, state), (controls_of(record), controls)):
        expected = original.model_copy(deep=True)
        assert copied == expected and copied is not original
        assert copied.model_fields_set == expected.model_fields_set
        assert copied.model_extra == expected.model_extra
        written = copied.model_dump(mode="json", exclude_unset=True)
        assert written == expected.model_dump(mode="json", exclude_unset=True)

    copied_state = record.state
    assert copied_state.output_data is not None
    copied_state.output_data["rows"][0]["n"] = 99
    copied_state.delivery_requests["delivery_2"] = "message_2"
    copied_state.judge_answers[0]["usage"]["input_tokens"] = 99
    copied_state.mcp_tools["files"][0]["parameters"]["type"] = "array"
    copied_state.loaded_skills.append("b")
    assert copied_state.model_extra is not None
    copied_state.model_extra["newer_release_key"]["nested"][1]["x"] = 99
    copied_controls = controls_of(record)
    copied_controls.inputs[0].text = "changed"
    assert copied_controls.inputs[0].model_extra is not None
    copied_controls.inputs[0].model_extra["later"]["a"].append(2)
    copied_controls.inputs.append(steering)
    assert record.model_dump(mode="json") == before


def test_what_is_changed_in_place_is_written_and_nothing_else() -> None:
    """``TurnOptions.stored()`` writes the keys that were set, and also what was changed in place in a default value
    (a default state's counter, a default list appended to, a steering input added to default controls), at every
    depth; a default left as it was is not written."""
    from turnkit.kernel.turn_state import SteeringInput, TurnOptions

    options = TurnOptions(task_queue="q")
    assert options.stored() == {"task_queue": "q"}
    options.state.iterations = 2
    options.state.loaded_skills.append("search")
    options.context["k"] = 1
    controls = options.controls_or_default
    controls.inputs.append(SteeringInput(id="s", key="k", text="go", turn_id="t", sequence=1))
    options.controls = controls
    controls.inputs[0].message_id = "message_1"
    assert options.stored() == {
        "task_queue": "q",
        "context": {"k": 1},
        "controls": {
            "inputs": [{"id": "s", "key": "k", "text": "go", "turn_id": "t", "sequence": 1, "message_id": "message_1"}]
        },
        "state": {"iterations": 2, "loaded_skills": ["search"]},
    }
