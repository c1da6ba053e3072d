"""``turnkit check`` and ``turnkit repair`` (issue 8, "the chaos suite and the checker", and item 4's repair sweep).

Each test creates a broken state, checks that ``check`` reports it with its ids, that ``repair`` fixes what is safe
to fix (and says so), that a second ``repair`` does nothing, and that ``check`` is clean afterwards. Checks run with
``since`` = the test's start, because the PostgreSQL test database is shared by the whole session.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import insert, update
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import PollWorkflowTaskQueueRequest

import turnkit
from tests.engine import Engine, Gate, eventually, gated_tool, stored_pending_turn
from tests.workers import ROOT
from turnkit._engine.ids import new_id
from turnkit._engine.turn_options import turn_options
from turnkit._ops import check as check_module
from turnkit._ops.check import (
    ACTIVE_TURNS,
    DELIVERY_NOT_CONSUMED,
    EXECUTION_WITHOUT_ATTEMPT,
    OVER_BUDGET,
    SEQUENCE_GAP,
    TOOL_CALL_RESULTS,
    TURN_WITHOUT_WORKFLOW,
    TURNS_OUT_OF_ORDER,
    WAIT_WITHOUT_END,
    WORKFLOW_CLOSED,
    WRITE_AFTER_REVOCATION,
    Finding,
    workflow_states,
)
from turnkit._ops.repair import LOST_WORKFLOW, STALE_STAGED_INPUT, repair
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.names import LANE_WORKFLOW
from turnkit.kernel.payloads import LaneInput
from turnkit.kernel.records import INTERRUPTED_MESSAGE, TurnRecord
from turnkit.kernel.turn_state import TurnState
from turnkit.model import ModelRequest, Result
from turnkit.runtime import TurnKit
from turnkit.store.schema import MessageRow, StagedInputRow
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools


def _kinds(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(f.kind, f.ids[0]) for f in findings}


def _once_then(name: str, arguments: dict[str, Any], answer: str = "done") -> ScriptedClient:
    """A model that calls ``name`` once per turn, then answers."""

    def script(request: ModelRequest) -> Result:
        if any(m["role"] == "tool" for m in request.messages[-1:]):
            return Result.build(text=answer)
        return call_tools((name, arguments))

    return ScriptedClient(script)


async def _skip_a_sequence(tx: Any, conversation_id: str) -> None:
    """Append a message to ``conversation_id`` one sequence past the next: a gap check reports and repair leaves."""
    now = utcnow()
    gap = insert(MessageRow).values(
        uid=f"message_gap_{conversation_id}",
        conversation_uid=conversation_id,
        role="user",
        kind="text",
        sequence=await tx.latest_message_sequence(conversation_id) + 2,
        content=[{"type": "text", "text": "skipped a sequence"}],
        metadata_={},
        created_at=now,
        updated_at=now,
    )
    await tx.connection.execute(gap)


async def _all_terminal(tk: TurnKit, since: Any) -> bool:
    turns = [t for t in await tk.store.list_turns() if t.created_at >= since]
    return all(t.terminal for t in turns)


@pytest.mark.usefixtures("through_lanes")
async def test_lost_lane_orphans_are_reported_and_repaired(tk: TurnKit) -> None:
    """A lane and its running turn terminated for real (by an operator) while the turn runs a tool and another turn
    waits in the lane: the running turn's execution has no attempt left, the queued turn has no workflow; repair
    fails the first (its call becomes ``interrupted``), re-queues the second (which then completes), and a second
    repair does nothing. (A lane's turns are abandoned children: terminating the lane alone leaves its turn running.)"""
    turnkit.configure(lost_submit_grace=None)  # what repair does: the workers' own search would queue the second
    since = utcnow()
    gate = Gate()
    agent = turnkit.Agent("busy", model="scripted", tools=[gated_tool(gate)], client=_once_then("slow", {}))
    conversation = await tk.conversation(agent)
    first = await conversation.ask("one", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    second = await conversation.ask("two", wait=False)
    await tk.client.get_workflow_handle(conversation.id).terminate("test: the lane is lost")
    await tk.client.get_workflow_handle(first.id).terminate("test: the turn is lost with it")

    async def closed() -> bool:
        return (await workflow_states(tk.client, [first.id]))[first.id] == "terminated"

    await eventually(closed, what="the running turn's workflow to be terminated")
    [execution] = await first.tool_executions()
    findings = await tk.check(since=since, grace=0)
    assert (WORKFLOW_CLOSED, first.id) in _kinds(findings), findings
    assert (EXECUTION_WITHOUT_ATTEMPT, execution.id) in _kinds(findings), findings
    assert (TURN_WITHOUT_WORKFLOW, second.id) in _kinds(findings), findings

    done = await tk.repair(since=since, grace=0)
    assert {("failed", first.id), ("requeued", second.id)} <= {(r.action, r.ids[0]) for r in done}, done
    gate.opened.set()  # the zombie tool body finishes now: fenced, it writes nothing
    finished = await second.result(timeout=60)
    assert finished.status == "completed"
    failed = await first.refresh()
    assert failed.status == "failed" and failed.error and failed.error["class"] == LOST_WORKFLOW
    [execution] = await failed.tool_executions()
    assert execution.status == "interrupted" and execution.error == {"message": INTERRUPTED_MESSAGE}
    results = [m for m in await failed.messages() if m.kind == "tool_result"]
    assert len(results) == 1 and results[0].metadata.get("interrupted") is True

    assert await tk.check(since=since, grace=0) == []
    assert await tk.repair(since=since, grace=0) == []  # idempotent


async def _orphan_child(tk: TurnKit, parent: TurnRecord, agent: turnkit.Agent, *, tool_name: str) -> TurnRecord:
    """What ``turnkit.delegate`` commits for one call (execution, child conversation, task message, pending child
    turn), written through the store API, with no workflow started for the child."""
    async with tk.store.atomic(turn_id=parent.id) as tx:
        launched = tool_name == "launch_agent"
        execution, _ = await tx.create_tool_execution(
            turn_id=parent.id,
            tool_call_id=f"call_{tool_name}",
            tool_name=tool_name,
            arguments={"agent_name": agent.name, "task": "work"} if launched else {"task": "work"},
            status="completed" if launched else "pending",
            result={} if launched else None,
            completed_at=utcnow() if launched else None,
        )
        lineage = {"parent_conversation_id": parent.conversation_id, "parent_turn_id": parent.id}
        conversation = await tx.create_conversation(agent_name=agent.name, model="scripted", metadata=lineage)
        message = await tx.append_message(conversation.id, role="user", text="work", metadata=lineage)
        return await tx.create_turn(
            conversation_id=conversation.id,
            agent_name=agent.name,
            parent_turn_id=parent.id,
            parent_tool_execution_id=execution.id,
            root_turn_id=parent.id,
            context_message_sequence=message.sequence,
            model="scripted",
            options=turn_options(agent, trigger_message_id=message.id, context={}, depth=1),
            submitted_at=utcnow(),
        )


async def test_orphaned_children_are_started_or_failed(tk: TurnKit) -> None:
    """issue 8 item 4: a launched child whose launch committed but whose workflow never started is started by repair
    and completes; a delegated child of a finished parent cannot be driven and is failed. The orphans are written
    through the store API (the lost-completion fault that makes them is exercised by the chaos suite)."""
    since = utcnow()
    helper = turnkit.register(turnkit.Agent("helper", model="scripted", client=ScriptedClient(lambda r: "helped")))
    lead = turnkit.Agent("lead", model="scripted", sub_agents=[helper], client=ScriptedClient(lambda r: "led"))
    parent = await (await tk.conversation(lead)).ask("lead")
    launched = await _orphan_child(tk, parent.record, helper, tool_name="launch_agent")
    delegated = await _orphan_child(tk, parent.record, helper, tool_name="helper")

    findings = await tk.check(since=since, grace=0)
    assert {(TURN_WITHOUT_WORKFLOW, launched.id), (TURN_WITHOUT_WORKFLOW, delegated.id)} <= _kinds(findings)
    assert await tk.check(since=since, grace=3600) == []  # young orphans may still be starting: not reported yet

    done = await tk.repair(since=since, grace=0)
    assert {("started", launched.id), ("failed", delegated.id)} == {(r.action, r.ids[0]) for r in done}, done
    child = await tk.turn(launched.id).result(timeout=60)
    assert child.status == "completed" and child.output_text == "helped"
    failed = await tk.turn(delegated.id).refresh()
    assert failed.status == "failed" and "never started" in str((failed.error or {}).get("message"))
    assert await tk.check(since=since, grace=0) == []
    assert await tk.repair(since=since, grace=0) == []


async def _start_task_of_lane(tk: TurnKit, task_queue: str) -> int:
    """Take the next workflow task of ``task_queue`` as a worker would, and never complete it (a worker that crashed
    or a server restarted mid-task); returns its attempt."""
    request = PollWorkflowTaskQueueRequest(
        namespace=tk.client.namespace, task_queue=TaskQueue(name=task_queue), identity="test: a crashing worker"
    )
    while True:
        task = await tk.client.workflow_service.poll_workflow_task_queue(request)
        if task.task_token:
            return task.attempt


async def test_a_lane_with_a_workflow_task_in_flight_may_hold_its_turns(tk: TurnKit) -> None:
    """A pending root turn with no workflow, in a conversation whose lane has a workflow task in flight (started by a
    worker that never completes it, as with a restarted server), is not an orphan: the task's history may name the
    turn (a store call's result) and it is tried again. Once the task keeps failing, the turn is reported. (Found by
    the chaos suite: a restart between a lane's woken-turn commit and its next task looked like an orphan.)"""
    since = utcnow()
    agent = turnkit.register(turnkit.Agent("held", model="scripted", client=ScriptedClient(lambda r: "ok")))
    conversation = await tk.conversation(agent)
    turn = await stored_pending_turn(tk, conversation.id, agent, "hi")
    task_queue = f"no-worker-{new_id('turn')}"  # no worker polls it: this test takes the lane's tasks itself
    lane = await tk.client.start_workflow(
        LANE_WORKFLOW,
        LaneInput(conversation_id=conversation.id),
        id=conversation.id,
        task_queue=task_queue,
        task_timeout=timedelta(seconds=1),
    )
    try:
        for expected in (1, 2, 3):  # each attempt times out after 1 s and is scheduled again
            assert await _start_task_of_lane(tk, task_queue) == expected
            findings = await tk.check(since=since, grace=0)
            assert (TURN_WITHOUT_WORKFLOW, turn.id) not in _kinds(findings), (expected, findings)
        assert await _start_task_of_lane(tk, task_queue) == 4  # failing now, not in flight: the lane is asked

        findings = await tk.check(since=since, grace=0)
        [finding] = [f for f in findings if (f.kind, f.ids[0]) == (TURN_WITHOUT_WORKFLOW, turn.id)]
        assert "does not answer" in finding.message, finding
    finally:
        await lane.terminate("test: end")
        async with tk.store.atomic() as tx:
            await tx.claim_turn(turn.id, from_=("pending",), to="failed", completed_at=utcnow(), claim_token=None)


async def test_lost_delivery_signal_from_the_cli(engine: Engine) -> None:
    """A delivery committed but never signalled (its sender died in between): ``turnkit check`` exits 1 naming it,
    ``turnkit repair`` signals it again, the lane applies it and wakes a turn, and ``turnkit check`` exits 0."""
    tk = engine.tk
    since = utcnow()
    agent = turnkit.Agent("inbox", model="scripted", client=ScriptedClient(lambda r: "read"))
    destination = await tk.conversation(agent)
    async with tk.store.atomic() as tx:
        delivery, _ = await tx.create_delivery(
            source_conversation_id=destination.id,
            destination_conversation_id=destination.id,
            key=f"lost:{destination.id}",
            payload={"text": "hello"},
        )

    async def cli(*args: str) -> subprocess.CompletedProcess[str]:
        options = ["--address", engine.temporal_address, "--database-url", engine.database_url]
        options += ["--task-queue", tk.task_queue, "--since", since.isoformat(), "--grace", "0"]
        command = [sys.executable, "-m", "turnkit.cli", *args, *options]
        # Off the event loop: the in-process worker must go on (it may hold SQLite's write lock mid-transaction,
        # and a blocked loop would keep it until the CLI's own transaction gave up: "database is locked").
        return await asyncio.to_thread(subprocess.run, command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    checked = await cli("check")
    assert checked.returncode == 1, checked.stderr
    assert f"{DELIVERY_NOT_CONSUMED} [{delivery.id}, {destination.id}]" in checked.stdout
    async with tk.worker():
        repaired = await cli("repair")
        assert f"resignalled [{delivery.id}]" in repaired.stdout, repaired.stdout + repaired.stderr

        async def applied() -> bool:
            [current] = await destination.inbox()
            return current.delivered_at is not None and await _all_terminal(tk, since)

        await eventually(applied, timeout=60, what="the re-signalled delivery to be applied and its turn to end")
        clean = await cli("check")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "every invariant holds" in clean.stdout


async def test_store_corruptions_are_reported(tk: TurnKit) -> None:
    """Sequence gaps, two active turns in one conversation, a finished turn's unanswered tool call and a tree over
    its iteration budget are each reported; repair answers the call and fails the turns that have no workflow, and
    leaves the record of what happened (gap, budget) as it is."""
    since = utcnow()
    agent = turnkit.register(turnkit.Agent("plain", model="scripted", client=ScriptedClient(lambda r: "ok")))
    conversation = await tk.conversation(agent)
    async with tk.store.atomic() as tx:
        message = await tx.append_message(conversation.id, role="user", text="hi")
        options = turn_options(agent, trigger_message_id=message.id, context={})
        assert options.budget_limits is not None
        options.budget_limits.max_iterations = 1
        options.state = TurnState(iterations=3)
        running = [
            await tx.create_turn(
                conversation_id=conversation.id, agent_name=agent.name, status="running", options=options
            )
            for _ in range(2)
        ]
        finished = await tx.create_turn(conversation_id=conversation.id, agent_name=agent.name, status="completed")
        await tx.append_message(
            conversation.id,
            role="assistant",
            kind="tool_call",
            content=[{"type": "tool_call", "id": "call_x", "name": "lookup", "arguments": {}}],
            turn_id=finished.id,
        )
        await _skip_a_sequence(tx, conversation.id)
    findings = await tk.check(since=since, grace=0)
    kinds = _kinds(findings)
    assert (ACTIVE_TURNS, conversation.id) in kinds
    assert (SEQUENCE_GAP, conversation.id) in kinds
    assert (TOOL_CALL_RESULTS, finished.id) in kinds
    assert {(OVER_BUDGET, t.id) for t in running} <= kinds
    assert {(TURN_WITHOUT_WORKFLOW, t.id) for t in running} <= kinds

    done = {(r.action, r.ids[0]) for r in await tk.repair(since=since, grace=0)}
    assert {("answered", finished.id), *(("failed", t.id) for t in running)} <= done
    left = _kinds(await tk.check(since=since, grace=0))
    assert (SEQUENCE_GAP, conversation.id) in left and (OVER_BUDGET, running[0].id) in left
    assert not {k for k, _ in left} & {ACTIVE_TURNS, TOOL_CALL_RESULTS, TURN_WITHOUT_WORKFLOW}


async def test_reconcile_runs_the_repair_sweep(tk: TurnKit) -> None:
    """issue 8 item 4: a woken root turn whose ``turnkit.deliver`` committed but whose completion was lost (written
    here through the store API: trigger message and pending turn, no lane) is re-queued by ``reconcile``, runs, and
    a second ``reconcile`` repairs nothing."""
    since = utcnow()
    agent = turnkit.Agent("woken", model="scripted", client=ScriptedClient(lambda r: "woke up"))
    conversation = await tk.conversation(agent)
    orphan = await stored_pending_turn(tk, conversation.id, agent, "a delivered message")
    reconciled = await tk.reconcile(since=since, grace=0)
    assert [(r.action, r.ids[0]) for r in reconciled.repairs if r.ids[0] == orphan.id] == [("requeued", orphan.id)]
    done = await tk.turn(orphan.id).result(timeout=60)
    assert done.status == "completed" and done.output_text == "woke up"
    assert [m.role for m in await conversation.messages()] == ["user", "assistant"]  # nothing written twice
    assert not [r for r in (await tk.reconcile(since=since, grace=0)).repairs if r.ids[0] == orphan.id]
    assert await tk.check(since=since, grace=0) == []


async def test_a_bounded_reconcile_requeues_a_ready_run_behind_a_blocked_conversation(tk: TurnKit) -> None:
    """T54: with ``maintenance_batch_size = 2``, a conversation blocked by a turn held running with 4 turns queued
    behind it, and an independent ready run that no lane holds (its submission lost): 8 ``reconcile`` calls re-queue
    the ready run once, and it completes; the blocked conversation is left as it was (1 running and 4 pending, none
    completed, nothing repaired there)."""
    since = utcnow()
    turnkit.configure(maintenance_batch_size=2)
    gate = Gate()

    def blocker_script(request: ModelRequest) -> Result | str:
        last = request.messages[-1]
        return call_tools(("slow", {})) if last["role"] == "user" and last["content"] == "hold" else "answered"

    blocker = turnkit.Agent(
        "blocker", model="scripted", tools=[gated_tool(gate)], client=ScriptedClient(blocker_script)
    )
    blocked = await tk.conversation(blocker)
    head = await blocked.ask("hold", wait=False)
    queued = [await blocked.ask(f"next {i}", wait=False) for i in range(4)]
    await asyncio.wait_for(gate.entered.wait(), 30)
    agent = turnkit.Agent("ready_run", model="scripted", client=ScriptedClient(lambda r: "ran"))
    ready = await stored_pending_turn(tk, (await tk.conversation(agent)).id, agent, "ready to run")

    repairs = [r for _ in range(8) for r in (await tk.reconcile(since=since, grace=0)).repairs]
    ours = {ready.id, head.id, *(t.id for t in queued)}
    assert [(r.action, r.ids[0]) for r in repairs if set(r.ids) & ours] == [("requeued", ready.id)], repairs
    done = await tk.turn(ready.id).result(timeout=60)
    assert done.status == "completed" and done.output_text == "ran"
    statuses = {t.id: t.status for t in await tk.store.list_turns(conversation_id=blocked.id)}
    assert statuses == {head.id: "running", **{t.id: "pending" for t in queued}}, "T54: the blocked lane is untouched"

    gate.opened.set()
    for turn in (head, *queued):
        assert (await turn.result(timeout=60)).status == "completed"


async def test_a_bounded_reconcile_fixes_what_lies_past_findings_it_only_reports(tk: TurnKit) -> None:
    """With ``maintenance_batch_size = 1`` and two sequence gaps, which check lists before an orphaned pending turn
    and repair never fixes, one ``reconcile`` re-queues the orphan and it runs: the batch bounds the fixes made, so
    findings that stay forever cannot hold back the ones behind them."""
    since = utcnow()
    turnkit.configure(maintenance_batch_size=1)
    agent = turnkit.Agent("behind_gaps", model="scripted", client=ScriptedClient(lambda r: "ran"))
    gapped = [await tk.conversation(agent) for _ in range(2)]
    async with tk.store.atomic() as tx:
        for conversation in gapped:
            await tx.append_message(conversation.id, role="user", text="hi")
            await _skip_a_sequence(tx, conversation.id)
    orphan = await stored_pending_turn(tk, (await tk.conversation(agent)).id, agent, "run me")
    kinds = [finding.kind for finding in await tk.check(since=since, grace=0)]
    assert kinds.index(TURN_WITHOUT_WORKFLOW) > kinds.index(SEQUENCE_GAP), kinds  # the gaps come first

    reconciled = await tk.reconcile(since=since, grace=0)
    assert [(r.action, r.ids[0]) for r in reconciled.repairs] == [("requeued", orphan.id)]
    assert (await tk.turn(orphan.id).result(timeout=60)).output_text == "ran"
    left = {kind for kind, _ in _kinds(await tk.check(since=since, grace=0))}
    assert left == {SEQUENCE_GAP}, "the gaps are reported, never rewritten"


async def test_a_lost_target_signal_is_reported_and_sent_again(tk: TurnKit) -> None:
    """A turn waits (``ask(wait_for=…)``) on a turn of another conversation; the target ends without signalling it
    (its terminal write is made through the store API, as if its worker died between the commit and the signal):
    ``check`` reports the wait without an end, ``repair`` signals it again, and the waiter completes."""
    since = utcnow()
    target_agent = turnkit.Agent("target", model="scripted", client=ScriptedClient(lambda r: "unused"))
    waiter_agent = turnkit.Agent("waiter", model="scripted", client=ScriptedClient(lambda r: "waited"))
    elsewhere = await tk.conversation(target_agent)
    async with tk.store.atomic() as tx:
        target = await tx.create_turn(
            conversation_id=elsewhere.id, agent_name=target_agent.name, status="running", submitted_at=utcnow()
        )
    waiter = await (await tk.conversation(waiter_agent)).ask("after the target", wait_for=[target.id], wait=False)

    async def waiting() -> bool:
        return (await waiter.refresh()).status == "waiting"

    await eventually(waiting, what="the waiter to wait")
    async with tk.store.atomic() as tx:
        await tx.claim_turn(target.id, from_="running", to="completed", output_text="done", completed_at=utcnow())
    findings = await tk.check(since=since, grace=0)
    assert (WAIT_WITHOUT_END, waiter.id) in _kinds(findings), findings
    done = await tk.repair(since=since, grace=0)
    assert ("woken", waiter.id) in {(r.action, r.ids[0]) for r in done}, done
    assert (await waiter.result(timeout=60)).status == "completed"
    assert await tk.check(since=since, grace=0) == []


async def test_repair_drops_staged_inputs_no_submission_consumed(tk: TurnKit) -> None:
    """issue 8 item 12: an ``ask`` whose update never reached its lane leaves a staged input; ``repair`` drops it
    once it is older than ``STALE_STAGED_INPUT`` (a fresh one may still be in flight, and is kept)."""
    since = utcnow()
    conversation = await tk.conversation(turnkit.Agent("stager", model="scripted", client=ScriptedClient(["ok"])))
    old, fresh = new_id("message"), new_id("message")
    async with tk.store.atomic() as tx:
        for staged_id in (old, fresh):
            await tx.stage_input(staged_id, conversation_id=conversation.id, content={"text": staged_id})
        aged = await tx.connection.execute(
            update(StagedInputRow)
            .where(StagedInputRow.uid == old)
            .values(created_at=utcnow() - STALE_STAGED_INPUT - timedelta(minutes=1))
        )
        assert aged.rowcount == 1
    repaired = await tk.repair(since=since, grace=0)
    assert [(r.action, r.ids) for r in repaired if r.action == "dropped"] == [("dropped", (old,))]
    async with tk.store.atomic() as tx:
        assert await tx.load_staged_input(fresh) == {"text": fresh}
        with pytest.raises(RecordNotFound):
            await tx.load_staged_input(old)
    assert not [r for r in await tk.repair(since=since, grace=0) if r.action == "dropped"]  # a second run finds nothing


async def test_a_turn_that_ends_while_check_asks_temporal_is_not_an_orphan(
    tk: TurnKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36 item 5 (chaos seed 25, found by describing every open turn while the seed ran): check reads the
    records, then asks Temporal about their workflows. A turn that ends in between (its terminal write, then its
    workflow's close) looked like a running turn whose workflow had closed: orphaned, then completed a moment later,
    and repair acted on it. Read again after Temporal answered, it is not reported, and repair leaves it alone."""
    since = utcnow()
    gate = Gate()
    agent = turnkit.Agent("ends-now", model="scripted", tools=[gated_tool(gate)], client=_once_then("slow", {}))
    turn = await (await tk.conversation(agent)).ask("go", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    asked = check_module.workflow_states

    async def ends_first(client: Any, workflow_ids: Any) -> dict[str, str]:
        ids = list(workflow_ids)
        if turn.id in ids and not gate.opened.is_set():  # the turn ends between the store's answer and Temporal's
            gate.opened.set()
            await turn.result(timeout=30)
        return await asked(client, ids)

    monkeypatch.setattr(check_module, "workflow_states", ends_first)
    assert await tk.check(since=since, grace=0) == []
    gate.opened.clear()
    stale = [Finding(WORKFLOW_CLOSED, (turn.id,), "turn is running but its workflow is completed")]
    assert await tk.repair(since=since, grace=0) == []
    assert await repair(tk.store, tk.client, tk.task_queue, findings=stale) == []
    assert (await turn.refresh()).status == "completed"


async def test_turns_run_out_of_submission_order_are_reported(tk: TurnKit) -> None:
    """Issue 36 item 5: ``turnkit check`` verifies the order in which a conversation's submitted turns ran (the model
    messages' sequences, not clocks): a turn that answered before one submitted earlier did, and a turn that ran
    while one submitted earlier had not started (a lost submission overtaken), are ``turns_out_of_order``."""
    since = utcnow()
    agent = turnkit.Agent("ordered-check", model="scripted", client=ScriptedClient([]))
    conversation = await tk.conversation(agent)
    second = await stored_pending_turn(tk, conversation.id, agent, "second")
    third = await stored_pending_turn(tk, conversation.id, agent, "third")
    fourth = await stored_pending_turn(tk, conversation.id, agent, "fourth")
    for answered in (third, second):  # the later one answered first, as the issue saw it
        await _answer(tk, answered)
    findings = [f for f in await tk.check(since=since, grace=0) if f.kind == TURNS_OUT_OF_ORDER]
    assert [f.ids for f in findings] == [(conversation.id, second.id, third.id)], findings  # earlier, then later
    fifth = await stored_pending_turn(tk, conversation.id, agent, "fifth")
    await _answer(tk, fifth)  # while "fourth", submitted before it, never ran
    findings = [f for f in await tk.check(since=since, grace=0) if f.kind == TURNS_OUT_OF_ORDER]
    assert (conversation.id, fourth.id, fifth.id) in [f.ids for f in findings], findings


async def _answer(tk: TurnKit, turn: TurnRecord) -> None:
    """A model answer of ``turn``, written to the store."""
    async with tk.store.atomic(conversation_id=turn.conversation_id) as tx:
        await tx.append_message(turn.conversation_id, role="assistant", text=f"answer {turn.id}", turn_id=turn.id)


async def test_a_tool_write_after_its_revocation_is_reported(tk: TurnKit) -> None:
    """Issue 36 item 8, T49: ``turnkit check`` finds a tool's write that came after its execution's result, or after
    its turn ended (a later turn answered before it), as ``write_after_revocation``; a write made while the call
    ran is clean."""
    since = utcnow()
    agent = turnkit.Agent("revoked-check", model="scripted", client=ScriptedClient([]))
    conversation = await tk.conversation(agent)
    async with tk.store.atomic(conversation_id=conversation.id) as tx:
        ended = await tx.create_turn(conversation_id=conversation.id, agent_name=agent.name, status="cancelled")
        ended = await tx.update_turn(ended.id, completed_at=utcnow())
        answered, _ = await tx.create_tool_execution(turn_id=ended.id, tool_call_id="call_a", tool_name="t")
        cut_off, _ = await tx.create_tool_execution(turn_id=ended.id, tool_call_id="call_b", tool_name="t")

        async def tool_write(execution_id: str, text: str) -> str:
            metadata = {"tool_execution_id": execution_id}
            return (await tx.append_message(conversation.id, role="user", text=text, metadata=metadata)).id

        in_time = await tool_write(answered.id, "while it ran")
        await tx.append_message(
            conversation.id,
            role="tool",
            kind="tool_result",
            content=[{"type": "tool_result", "tool_call_id": "call_a", "content": "ok"}],
            turn_id=ended.id,
            tool_execution_id=answered.id,
        )
        after_result = await tool_write(answered.id, "after its result")
        later = await tx.create_turn(conversation_id=conversation.id, agent_name=agent.name, status="completed")
        await tx.update_turn(later.id, started_at=utcnow())
        await tx.append_message(conversation.id, role="assistant", text="the next answer", turn_id=later.id)
        after_end = await tool_write(cut_off.id, "after its turn ended")
    findings = {f.ids for f in await tk.check(since=since, grace=0) if f.kind == WRITE_AFTER_REVOCATION}
    assert findings == {(answered.id, after_result), (cut_off.id, after_end)}
    assert all(in_time not in ids for ids in findings)
