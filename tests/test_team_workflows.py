"""A team's own workflows asking TurnKit agents as steps (``turnkit.workflow``), on a real dev server and database.

The team's workflows are in ``tests/team_app.py``; the crash test runs them on real worker processes
(``tests/team_worker.py``), killed with SIGKILL. What a test counts comes from the store (turns, messages, wait rows),
from the agents' traces (model calls) and from the team workflow's history (submissions).
"""

from __future__ import annotations

import ast
import asyncio
import os
import re
import signal
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import ExecuteWorkflowInput, WorkflowInboundInterceptor

import turnkit
from tests.engine import Engine, HeldModel, busy_agent, eventually
from tests.sources import parse
from tests.team_app import ApprovalWorkflow, AskPlan, AskWorkflow, OwnSignalWorkflow
from turnkit._activities.asks import CALLER_KEY, AskActivities
from turnkit.kernel.asks import AskTurn, TurnResult
from turnkit.kernel.payloads import LaneStatus
from turnkit.kernel.records import CANCELLED_CLASS, CANCELLED_MESSAGE, ConversationRecord, MessageRecord, TurnRecord
from turnkit.runtime import TurnKit
from turnkit.store.rows import conversation_record
from turnkit.store.schema import ConversationRow
from turnkit.store.statements import whole_rows
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient
from turnkit.workflow import _CancelAskedTurnsInbound

ROOT = Path(__file__).resolve().parent.parent
TEAM_WORKFLOWS = [ApprovalWorkflow, AskWorkflow, OwnSignalWorkflow]


# -- helpers ----------------------------------------------------------------------------------------------------------


def _id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


async def conversations_of(tk: TurnKit, workflow_id: str) -> list[ConversationRecord]:
    """The conversations a workflow opened (their metadata names it), oldest first."""
    async with tk.store.reads() as tx:
        rows = await tx.connection.execute(whole_rows(ConversationRow).order_by(ConversationRow.id))
        conversations = [conversation_record(row) for row in rows]
    return [c for c in conversations if (c.metadata.get(CALLER_KEY) or {}).get("workflow_id") == workflow_id]


async def turns_in(tk: TurnKit, conversations: list[ConversationRecord]) -> list[TurnRecord]:
    """Every turn of ``conversations``, whoever asked it."""
    return [t for c in conversations for t in await tk.store.list_turns(conversation_id=c.id)]


def assert_one_copy_of_each(messages: list[MessageRecord]) -> None:
    """A conversation's messages: no id twice, sequences 1..n without a gap or a repeat."""
    assert len({m.id for m in messages}) == len(messages)
    assert [m.sequence for m in messages] == list(range(1, len(messages) + 1))


async def activity_types(handle: WorkflowHandle[Any, Any]) -> Counter[str]:
    """How many activities of each type the workflow scheduled (its history)."""
    events = (await handle.fetch_history()).events
    scheduled = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    return Counter(e.activity_task_scheduled_event_attributes.activity_type.name for e in scheduled)


async def timers_fired(handle: WorkflowHandle[Any, Any]) -> int:
    events = (await handle.fetch_history()).events
    return sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED)


@pytest_asyncio.fixture
async def team(engine: Engine) -> AsyncIterator[TurnKit]:
    """An in-process worker that runs the team's workflows beside TurnKit's (the client's ``TurnKitPlugin``)."""
    async with engine.tk.worker(workflows=TEAM_WORKFLOWS):
        yield engine.tk


def register_reviewers(drafter: Any = None, legal: Any = None, finance: Any = None) -> None:
    """The approval's agents, answering from scripts unless given a model client."""

    def draft(request: turnkit.ModelRequest) -> str:
        asked = str(request.messages[-1]["content"])
        return "APPROVED: " + " | ".join(asked.splitlines()[1:]) if asked.startswith("Combine") else "DRAFT"

    turnkit.register(turnkit.Agent("drafter", model="scripted", client=drafter or ScriptedClient(draft)))
    turnkit.register(turnkit.Agent("legal", model="scripted", client=legal or ScriptedClient(lambda _: "no risk")))
    turnkit.register(turnkit.Agent("finance", model="scripted", client=finance or ScriptedClient(lambda _: "cheap")))


# -- the team's approval ----------------------------------------------------------------------------------------------


async def test_an_approval_asks_agents_through_turnkit_and_a_replay_starts_no_second_turn(engine: Engine) -> None:
    """The team's approval runs as written (a draft, a human's decision, two reviews in parallel, a summary in the
    draft's conversation) on a worker that keeps no workflow in its cache, so every workflow task replays the
    whole history: still exactly four turns in three conversations, one wait row each, one submission each. The turns'
    ends reached the workflow as signals: no poll timer fired."""
    register_reviewers()
    tk = engine.tk
    async with tk.worker(workflows=TEAM_WORKFLOWS, max_cached_workflows=0):
        handle = await tk.client.start_workflow(
            ApprovalWorkflow.run, "a laptop for Sam", id=_id("approval"), task_queue=tk.task_queue
        )
        await handle.signal(ApprovalWorkflow.decide, True)
        answer = await asyncio.wait_for(handle.result(), 60)
    assert answer == "APPROVED: Legal: no risk | Finance: cheap"
    conversations = await conversations_of(tk, handle.id)
    assert sorted(c.agent_name for c in conversations) == ["drafter", "finance", "legal"]
    turns = await turns_in(tk, conversations)
    assert sorted(t.agent_name for t in turns) == ["drafter", "drafter", "finance", "legal"]
    assert {t.status for t in turns} == {"completed"}
    async with tk.store.reads() as tx:
        waits = await tx.list_waits(turn_id=handle.id)
    assert sorted(w.target_turn_id for w in waits) == sorted(t.id for t in turns)
    assert (await activity_types(handle))["turnkit.ask_from_workflow"] == 4
    assert await timers_fired(handle) == 0
    for conversation in conversations:
        assert_one_copy_of_each(await tk.store.list_messages(conversation.id))


async def test_a_rejected_approval_asks_nothing_more(team: TurnKit) -> None:
    """The human says no: the draft was the only turn."""
    register_reviewers()
    handle = await team.client.start_workflow(
        ApprovalWorkflow.run, "a yacht", id=_id("approval"), task_queue=team.task_queue
    )
    await handle.signal(ApprovalWorkflow.decide, False)
    assert await asyncio.wait_for(handle.result(), 60) == "rejected"
    turns = await turns_in(team, await conversations_of(team, handle.id))
    assert [(t.agent_name, t.status) for t in turns] == [("drafter", "completed")]


class TeamWorker:
    """``python -m tests.team_worker`` as a child process: the team's own worker, killed for real."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, engine: Engine, task_queue: str) -> TeamWorker:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.team_worker",
            engine.temporal_address,
            task_queue,
            engine.database_url,
            cwd=str(ROOT),
            env={**os.environ, "TURNKIT_LOG_LEVEL": "WARNING"},
            stdout=asyncio.subprocess.PIPE,
        )
        assert process.stdout is not None
        async with asyncio.timeout(60):
            while not (line := await process.stdout.readline()).startswith(b"worker ready"):
                if not line:
                    raise RuntimeError(f"the team's worker exited before it was ready ({await process.wait()})")
        return cls(process)

    async def kill(self) -> None:
        """SIGKILL: no shutdown, no cleanup, as a lost machine."""
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(self.process.wait(), 30)


def traces(crash_dir: Path, agent: str) -> list[str]:
    """The request id of each model call the agent had, in the worker processes (``tests/team_worker.py``)."""
    path = crash_dir / agent
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.crash
async def test_a_killed_worker_in_the_parallel_phase_repeats_nothing_and_loses_nothing(
    engine: Engine, crash_dir: Path
) -> None:
    """The team's approval on its own worker process, SIGKILLed while both reviews are in their model calls; a new
    worker finishes it. Four turns, all completed, in three conversations; each turn committed one answer, and each
    conversation holds each message once; the drafter was called twice (draft, summary), and each reviewer's lost
    call was asked again under its request id (never a second answer); the workflow submitted each of its four turns
    once, and the store's invariants hold."""
    since = utcnow()
    queue = _id("team")
    first = await TeamWorker.start(engine, queue)
    handle = await engine.tk.client.start_workflow(
        ApprovalWorkflow.run, "a laptop for Sam", id=_id("approval"), task_queue=queue
    )

    async def drafted() -> bool:
        return len(traces(crash_dir, "drafter")) == 1

    await eventually(drafted, what="the draft")
    await handle.signal(ApprovalWorkflow.decide, True)

    async def reviewing() -> bool:
        return bool(traces(crash_dir, "legal") and traces(crash_dir, "finance"))

    await eventually(reviewing, what="both reviews in their model calls")
    await first.kill()
    second = await TeamWorker.start(engine, queue)
    try:
        answer = await asyncio.wait_for(handle.result(), 120)
    finally:
        await second.stop()

    assert answer == "APPROVED: Legal: no legal risk | Finance: within budget"
    tk = engine.tk
    conversations = await conversations_of(tk, handle.id)
    assert sorted(c.agent_name for c in conversations) == ["drafter", "finance", "legal"]
    turns = await turns_in(tk, conversations)
    assert sorted((t.agent_name, t.status) for t in turns) == [
        ("drafter", "completed"),
        ("drafter", "completed"),
        ("finance", "completed"),
        ("legal", "completed"),
    ]
    async with tk.store.reads() as tx:
        for turn in turns:
            answers = [m for m in await tx.list_turn_messages(turn.id) if m.role == "assistant"]
            assert len(answers) == 1, (turn.agent_name, answers)
    for conversation in conversations:
        messages = await tk.store.list_messages(conversation.id)
        assert_one_copy_of_each(messages)
        assert [m.role for m in messages] == ["user", "assistant"] * (2 if conversation.agent_name == "drafter" else 1)
    drafter = traces(crash_dir, "drafter")
    assert len(drafter) == 2 and len(set(drafter)) == 2
    for reviewer in ("legal", "finance"):
        calls = traces(crash_dir, reviewer)
        assert len(calls) == 2 and len(set(calls)) == 1, calls  # the lost call, asked again under its request id
    assert (await activity_types(handle))["turnkit.ask_from_workflow"] == 4
    # The store may hold other tests' records: only what this workflow's turns and conversations touch counts.
    ours = {c.id for c in conversations} | {t.id for t in turns}
    assert [f for f in await tk.check(since=since) if ours & set(f.ids)] == []


# -- cancellation, failure, bounds ------------------------------------------------------------------------------------


async def test_cancelling_the_team_workflow_cancels_its_running_turns(team: TurnKit) -> None:
    """The approval is cancelled while both reviews are in their model calls: both turns end ``cancelled`` (the
    workflow cancelled each one, through its cancel activity, before its own cancellation went on), and the drafter's
    finished turn is left as it was."""
    legal, finance = HeldModel(turnkit.Result.build(text="late")), HeldModel(turnkit.Result.build(text="late"))
    register_reviewers(legal=legal, finance=finance)
    handle = await team.client.start_workflow(
        ApprovalWorkflow.run, "a laptop", id=_id("approval"), task_queue=team.task_queue
    )
    await handle.signal(ApprovalWorkflow.decide, True)
    await asyncio.wait_for(asyncio.gather(legal.entered.wait(), finance.entered.wait()), 30)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 60)
    assert isinstance(failure.value.cause, CancelledError)
    turns = await turns_in(team, await conversations_of(team, handle.id))
    assert sorted((t.agent_name, t.status) for t in turns) == [
        ("drafter", "completed"),
        ("finance", "cancelled"),
        ("legal", "cancelled"),
    ]
    assert (await activity_types(handle))["turnkit.control_asked_turn"] == 2
    legal.released.set()
    finance.released.set()


async def test_cancelling_the_team_workflow_cancels_a_turn_it_is_not_awaiting(team: TurnKit) -> None:
    """The workflow started a turn and waits for something else (a human) when it is cancelled: Temporal cancels only
    its main task, and the plugin's interceptor cancels the turn it did not see end."""
    model = HeldModel(turnkit.Result.build(text="never"))
    turnkit.register(turnkit.Agent("ponder", model="scripted", client=model))
    plan = AskPlan(text="think", agent="ponder", controls=["pause"])  # waits for `proceed`, which never comes
    handle = await team.client.start_workflow(AskWorkflow.run, plan, id=_id("ask"), task_queue=team.task_queue)
    await asyncio.wait_for(model.entered.wait(), 30)

    async def asked() -> bool:  # the turn may run before the workflow's task that learns its id has completed
        return await handle.query(AskWorkflow.asked) is not None

    await eventually(asked, what="the workflow to report the turn it started")
    turn_id = await handle.query(AskWorkflow.asked)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await asyncio.wait_for(handle.result(), 60)
    assert isinstance(failure.value.cause, CancelledError)
    assert (await team.store.load_turn(str(turn_id))).status == "cancelled"
    assert (await activity_types(handle))["turnkit.control_asked_turn"] == 1
    model.released.set()


class _Suspend:
    def __await__(self) -> Any:
        yield


class _NeverEnds(WorkflowInboundInterceptor):
    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        await _Suspend()


def test_a_run_dropped_from_the_workers_cache_closes_without_cancelling() -> None:
    """A run evicted from the worker's cache is closed with GeneratorExit, outside any event loop: the plugin's
    interceptor lets it close (its turns go on) instead of raising "no running event loop" from the close."""
    run = _CancelAskedTurnsInbound(_NeverEnds(None)).execute_workflow(None)  # type: ignore[arg-type]
    run.send(None)
    run.close()  # raised RuntimeError before the interceptor let GeneratorExit through


async def test_a_failed_turn_is_a_typed_result_and_can_fail_the_workflow(team: TurnKit) -> None:
    """A turn whose model fails comes back as a result: ``failed``, with the error's class and message. Asked to
    raise (``raise_for_status``), the workflow fails with that TurnKit error at once (no workflow task retried
    forever)."""
    turnkit.register(turnkit.Agent("broken", model="scripted", client=ScriptedClient([])))
    result = await team.client.execute_workflow(
        AskWorkflow.run, AskPlan(text="hi", agent="broken"), id=_id("ask"), task_queue=team.task_queue
    )
    assert isinstance(result, TurnResult)
    assert (result.status, result.error_class) == ("failed", "TurnKit::ModelError")
    assert result.error_message is not None and "no more results" in result.error_message
    assert result.output_text == "" and not result.completed
    with pytest.raises(WorkflowFailureError) as failure:
        await team.client.execute_workflow(
            AskWorkflow.run,
            AskPlan(text="hi", agent="broken", raise_for_status=True),
            id=_id("ask"),
            task_queue=team.task_queue,
        )
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ModelError", cause
    assert "no more results" in cause.message


async def test_bad_input_fails_the_workflow_with_the_input_error_and_writes_nothing(team: TurnKit) -> None:
    """Input TurnKit cannot take (an agent no worker registered) fails the asking workflow with TurnKit's error
    class; nothing is written."""
    with pytest.raises(WorkflowFailureError) as failure:
        await team.client.execute_workflow(
            AskWorkflow.run,
            AskPlan(text="hi", agent="nobody"),
            id=(workflow_id := _id("ask")),
            task_queue=team.task_queue,
        )
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "ConfigError", cause
    assert await conversations_of(team, workflow_id) == []


async def test_a_workflow_with_a_long_id_asks_an_agent(team: TurnKit) -> None:
    """A workflow whose id is 900 characters long (business keys make long ids; Temporal allows 1,000) asks an agent
    and gets its answer: the turn's end signals it by that id, which its wait row keeps whole."""
    turnkit.register(turnkit.Agent("plain", model="scripted", client=ScriptedClient(lambda _: "fine")))
    workflow_id = _id("ask-" + "k" * 860)
    assert len(workflow_id) > 64
    result = await team.client.execute_workflow(
        AskWorkflow.run, AskPlan(text="hi", agent="plain"), id=workflow_id, task_queue=team.task_queue
    )
    assert (result.status, result.output_text) == ("completed", "fine")
    async with team.store.atomic() as tx:
        assert [wait.target_turn_id for wait in await tx.list_waits(turn_id=workflow_id)] == [result.turn_id]


async def test_a_huge_answer_comes_back_bounded_and_stays_whole_in_the_store(team: TurnKit) -> None:
    """An answer of 300 kB comes back cut to the asked limit (at a character boundary), marked truncated with its
    full size; the turn's record keeps all of it."""
    answer = "é" * 150_000  # two bytes each
    turnkit.register(turnkit.Agent("verbose", model="scripted", client=ScriptedClient(lambda _: answer)))
    result = await team.client.execute_workflow(
        AskWorkflow.run,
        AskPlan(text="say a lot", agent="verbose", output_limit=1001),
        id=_id("ask"),
        task_queue=team.task_queue,
    )
    assert result.status == "completed" and result.output_truncated
    assert result.output_text == "é" * 500 and result.output_bytes == 300_000
    assert (await team.store.load_turn(result.turn_id)).output_text == answer


async def test_ask_in_an_existing_conversation_queues_behind_its_active_turn(team: TurnKit) -> None:
    """A workflow asks in a conversation whose turn is running: its turn is queued in the conversation's lane (FIFO,
    one active turn) and starts only once that turn has ended."""
    release, agent = busy_agent("desk")
    conversation = await team.conversation(agent)
    busy = await conversation.ask("busy", wait=False)
    handle = await team.client.start_workflow(
        AskWorkflow.run,
        AskPlan(text="second", conversation_id=conversation.id),
        id=_id("ask"),
        task_queue=team.task_queue,
    )

    async def queued() -> bool:
        turn_id = await handle.query(AskWorkflow.asked)
        if turn_id is None:
            return False
        lane = await team.client.get_workflow_handle(conversation.id).query("status", result_type=LaneStatus)
        return lane.queued_turn_ids == [turn_id]

    await eventually(queued, what="the workflow's turn queued behind the busy one")
    asked = await team.store.load_turn(str(await handle.query(AskWorkflow.asked)))
    assert (asked.status, asked.started_at) == ("pending", None)
    release.set()
    result = await asyncio.wait_for(handle.result(), 60)
    assert (result.status, result.output_text, result.conversation_id) == (
        "completed",
        "answered second",
        conversation.id,
    )
    first, second = await busy.result(timeout=30), await team.store.load_turn(result.turn_id)
    assert first.record.completed_at is not None and second.started_at is not None
    assert second.started_at >= first.record.completed_at
    users = [m.content[0]["text"] for m in await conversation.messages() if m.role == "user"]
    assert users == ["busy", "second"]


# -- controls ---------------------------------------------------------------------------------------------------------


async def test_a_handle_pauses_steers_and_resumes_its_turn(team: TurnKit) -> None:
    """From the workflow, the handle pauses the running turn, steers it and resumes it, as ``Turn`` does: the steering
    is applied before the held answer is published, and the result is the revised answer."""
    model = HeldModel(turnkit.Result.build(text="first draft"), then="revised")
    turnkit.register(turnkit.Agent("writer", model="scripted", client=model))
    plan = AskPlan(text="write", agent="writer", controls=["pause", "steer:revise before publishing", "resume"])
    handle = await team.client.start_workflow(AskWorkflow.run, plan, id=_id("ask"), task_queue=team.task_queue)
    await asyncio.wait_for(model.entered.wait(), 30)
    await handle.signal(AskWorkflow.proceed)

    async def controlled() -> bool:
        return len(await handle.query(AskWorkflow.controlled)) == 3

    await eventually(controlled, what="the three controls")
    assert await handle.query(AskWorkflow.controlled) == ["running", "1 receipt(s)", "running"]
    model.released.set()
    result = await asyncio.wait_for(handle.result(), 60)
    assert (result.status, result.output_text) == ("completed", "revised")
    assert model.requests[1].messages[-1] == {"role": "user", "content": "revise before publishing"}


async def test_a_handle_cancels_its_turn(team: TurnKit) -> None:
    """``handle.cancel()`` ends the turn ``cancelled``; ``handle.result()`` then returns that."""
    model = HeldModel(turnkit.Result.build(text="never"))
    turnkit.register(turnkit.Agent("slowpoke", model="scripted", client=model))
    plan = AskPlan(text="think", agent="slowpoke", controls=["cancel"])
    handle = await team.client.start_workflow(AskWorkflow.run, plan, id=_id("ask"), task_queue=team.task_queue)
    await asyncio.wait_for(model.entered.wait(), 30)
    await handle.signal(AskWorkflow.proceed)
    result = await asyncio.wait_for(handle.result(), 60)
    assert (result.status, result.error_class, result.error_message) == (
        "cancelled",
        CANCELLED_CLASS,
        CANCELLED_MESSAGE,
    )
    assert await handle.query(AskWorkflow.controlled) == ["cancelled"]
    model.released.set()


async def test_a_signal_handler_of_the_teams_own_keeps_working(team: TurnKit) -> None:
    """The team's workflow handles ``target_finished`` itself: ``turnkit.workflow`` keeps that handler (it is called
    after TurnKit's own note of the turn's end), and the turn's result still arrives by the signal."""
    model = HeldModel(turnkit.Result.build(text="ok"))
    turnkit.register(turnkit.Agent("signalled", model="scripted", client=model))
    handle = await team.client.start_workflow(
        OwnSignalWorkflow.run, "signalled", id=_id("own"), task_queue=team.task_queue
    )

    async def asked() -> bool:
        return await handle.query(OwnSignalWorkflow.asked) is not None

    await eventually(asked, what="the turn submitted, its waiter registered")
    model.released.set()
    assert await asyncio.wait_for(handle.result(), 60) == ["completed", await handle.query(OwnSignalWorkflow.asked)]
    assert await timers_fired(handle) == 0


# -- the activity, retried --------------------------------------------------------------------------------------------


async def test_a_retried_submission_finds_the_turn_its_first_attempt_wrote(team: TurnKit) -> None:
    """The submit activity run three times with one input (as retries after lost replies would): one conversation, one
    message, one turn; the third run, after the turn ended, returns its result."""
    turnkit.register(turnkit.Agent("echo", model="scripted", client=ScriptedClient(lambda _: "once")))
    request = AskTurn(
        caller_workflow_id=_id("caller"),
        caller_run_id="run",
        turn_id=f"turn_{uuid.uuid4().hex[:24]}",
        message_id=f"msg_{uuid.uuid4().hex[:24]}",
        conversation_id=f"conv_{uuid.uuid4().hex[:24]}",
        new_conversation=True,
        agent_name="echo",
        text="hello",
        task_queue=team.task_queue,
    )
    activities = AskActivities(team.store)
    environment = ActivityEnvironment(client=team.client)
    first = await environment.run(activities.ask, request)
    second = await environment.run(activities.ask, request)
    assert (first.turn_id, second.turn_id) == (request.turn_id, request.turn_id)
    await team.turn(request.turn_id).result(timeout=30)
    third = await environment.run(activities.ask, request)
    assert third.result is not None and third.result.output_text == "once"
    turns = await team.store.list_turns(conversation_id=request.conversation_id)
    assert [t.id for t in turns] == [request.turn_id]
    messages = await team.store.list_messages(request.conversation_id)
    assert [(m.id, m.role) for m in messages][:1] == [(request.message_id, "user")]
    assert [m.role for m in messages] == ["user", "assistant"]


# -- the README -------------------------------------------------------------------------------------------------------

README_SECTION = "## Use TurnKit from your own workflow"


def readme_files() -> dict[str, str]:
    """The section's Python blocks, by the file each one names in its first line (``# approvals.py``)."""
    text = (ROOT / "README.md").read_text()
    section = text.split(README_SECTION, 1)[1].split("\n## ", 1)[0]
    files: dict[str, str] = {}
    for block in re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL):
        name = re.match(r"# (\w+\.py)\n", block)
        if name:
            files[name.group(1)] = block
    return files


def test_the_readmes_workflow_is_the_tested_one() -> None:
    """The README's ``ApprovalWorkflow`` is ``tests/team_app.py``'s, statement for statement (docstrings aside)."""

    def approval(source: str) -> str:
        tree = parse(source)
        [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ApprovalWorkflow"]
        for node in ast.walk(cls):
            body = getattr(node, "body", None)
            first = body[0] if isinstance(body, list) and body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                body.pop(0)  # type: ignore[union-attr]  # a docstring
        return ast.dump(cls)

    files = readme_files()
    assert approval(files["approvals.py"]) == approval((ROOT / "tests" / "team_app.py").read_text())
