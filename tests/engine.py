"""Test helpers shared by the engine tests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

import turnkit
from turnkit._engine.turn_build import ticket_of
from turnkit._engine.turn_options import turn_options
from turnkit._workflows.turn import TurnWorkflow
from turnkit.handles import Conversation, Turn
from turnkit.kernel.payloads import LaneStatus, TurnInput, TurnOutcome
from turnkit.kernel.records import TurnRecord
from turnkit.kernel.turn_state import TurnOptions
from turnkit.model import ModelRequest, Result
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools
from turnkit.tools import Tool, tool


@dataclass
class Engine:
    """A TurnKit connection plus what a worker process needs to join it."""

    tk: TurnKit
    database_url: str
    temporal_address: str


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float = 30.0, what: str = "condition") -> None:
    """Wait until ``check()`` is true, polling; fail with ``what`` after ``timeout`` seconds (no fixed sleeps)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.01
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.25)


async def turn_for_activities(
    tk: TurnKit, conversation: Conversation, text: str, *, status: str = "pending"
) -> TurnRecord:
    """A turn record for ``text``, said now in ``conversation``, created in the store and never submitted: no
    workflow runs it, so a test drives its activities by hand (a retried attempt, say)."""
    trigger = await conversation.say(text)
    async with tk.store.atomic() as tx:
        return await tx.create_turn(
            conversation_id=conversation.id,
            agent_name=conversation.agent_name,
            context_message_sequence=trigger.sequence,
            model="scripted",
            status=status,
            options={"trigger_message_id": trigger.id},
        )


async def start_turn_workflow(
    client: Client, turn: TurnRecord, task_queue: str, *, deadline_without_timer: bool = True, **options: Any
) -> WorkflowHandle[TurnWorkflow, TurnOutcome]:
    """Start the workflow of the root turn ``turn`` with what its submission ticket says, as the lane does, but
    directly (``options`` go to ``start_workflow``). ``deadline_without_timer=False``: the input of a turn started
    before that field existed (the deadline's timer from the start)."""
    ticket = ticket_of(turn)
    return await client.start_workflow(
        TurnWorkflow.run,
        TurnInput(
            turn_id=turn.id,
            conversation_id=turn.conversation_id,
            agent_name=turn.agent_name,
            root_turn_id=turn.root_turn_id,
            deadline=ticket.deadline,
            model_policy=ticket.model_policy,
            deadline_without_timer=deadline_without_timer,
        ),
        id=turn.id,
        task_queue=task_queue,
        **options,
    )


async def lane_buffers(tk: TurnKit, conversation_id: str, delivery_id: str) -> bool:
    """Whether the conversation's lane holds ``delivery_id`` for later (it arrived while a turn was busy)."""
    status = await tk.client.get_workflow_handle(conversation_id).query("status", result_type=LaneStatus)
    return delivery_id in status.pending_delivery_ids


def held_tool(name: str = "hold") -> tuple[asyncio.Event, Tool]:
    """A tool that blocks until the returned event is set: keeps a turn busy for as long as a test needs."""
    release = asyncio.Event()

    async def body() -> dict[str, Any]:
        await release.wait()
        return {}

    body.__name__ = name
    body.__doc__ = "Wait until released."
    return release, tool(body)


def busy_agent(name: str) -> tuple[asyncio.Event, turnkit.Agent]:
    """An agent whose turn on "busy" holds in a tool until the event is set; it answers any other input at once."""
    release, hold = held_tool()

    def script(request: ModelRequest) -> Result:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"] == "busy":
            return call_tools(("hold", {}))
        return Result.build(text=f"answered {last['content'] if last['role'] == 'user' else 'busy'}")

    return release, turnkit.Agent(name, model="scripted", tools=[hold], client=ScriptedClient(script))


async def lane_exists(tk: TurnKit, conversation_id: str) -> bool:
    """Whether the conversation's lane workflow was ever started."""
    try:
        await tk.client.get_workflow_handle(conversation_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


class Gate:
    """A tool body that blocks until the test opens the gate, and counts its runs."""

    def __init__(self) -> None:
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()
        self.runs = 0


def gated_tool(gate: Gate, name: str = "slow", **options: Any) -> Tool:
    """A tool named ``name`` that enters ``gate``, waits until it is opened and returns ``{"done": True}``;
    ``options`` are :func:`turnkit.tool`'s (``terminal=...``)."""

    async def body() -> dict[str, Any]:
        gate.runs += 1
        gate.entered.set()
        await gate.opened.wait()
        return {"done": True}

    body.__name__ = name
    body.__doc__ = "Work until released."
    return tool(**options)(body) if options else tool(body)


class HeldModel:
    """A model client whose first call blocks until released; later calls answer ``then`` (text, or a function of
    the request)."""

    def __init__(self, first: Result, then: str | Callable[[ModelRequest], Result] = "answer") -> None:
        self.first, self.then = first, then
        self.entered, self.released = asyncio.Event(), asyncio.Event()
        self.requests: list[ModelRequest] = []

    async def chat(self, request: ModelRequest) -> Result:
        self.requests.append(request)
        if len(self.requests) == 1:
            self.entered.set()
            await self.released.wait()
            return self.first
        return self.then(request) if callable(self.then) else Result.build(text=self.then)


@dataclass
class BusySubAgent:
    """A lead's turn whose sub-agent (``digger``) holds its own turn in a tool, in the sub-agent's conversation."""

    turn: Turn  #: the lead's turn
    child: TurnRecord  #: the sub-agent's running turn
    conversation: Conversation  #: the sub-agent's conversation
    client: ScriptedClient  #: the sub-agent's model: "dig" calls ``hold``, anything else answers "child saw …"
    release: asyncio.Event  #: lets the held tool finish


async def busy_sub_agent(tk: TurnKit) -> BusySubAgent:
    """Start a lead whose sub-agent's turn is held running in its own conversation (the lane of that conversation
    does not run it: its parent does)."""
    release, hold = held_tool()

    def child_script(request: ModelRequest) -> Result:
        if request.messages[-1]["content"] == "dig":
            return call_tools(("hold", {}))
        return Result.build(text=f"child saw {request.messages[-1]['content']}")

    child_client = ScriptedClient(child_script)
    child = turnkit.Agent("digger", model="scripted", tools=[hold], client=child_client)
    lead_client = ScriptedClient([call_tools(("digger", {"task": "dig"})), "done"])
    parent = turnkit.Agent("lead", model="scripted", sub_agents=[child], client=lead_client)
    turn = await (await tk.conversation(parent)).ask("go", wait=False)

    async def child_turn() -> TurnRecord | None:
        tree = await tk.store.list_turns(root_turn_id=turn.id)
        return next((t for t in tree if t.id != turn.id and t.status == "running"), None)

    async def child_running() -> bool:
        return await child_turn() is not None

    await eventually(child_running, what="the sub-agent's turn")
    record = await child_turn()
    assert record is not None
    conversation = await tk.load_conversation(record.conversation_id)
    return BusySubAgent(turn=turn, child=record, conversation=conversation, client=child_client, release=release)


async def stored_pending_turn(tk: TurnKit, conversation_id: str, agent: turnkit.Agent, text: str) -> TurnRecord:
    """A submitted root turn and its user message, written through the store API with no workflow and no lane (what
    a woken turn or an ``ask`` leaves when the process that wrote it dies before the turn is queued)."""
    async with tk.store.atomic(conversation_id=conversation_id) as tx:
        message = await tx.append_message(conversation_id, role="user", text=text)
        return await tx.create_turn(
            conversation_id=conversation_id,
            agent_name=agent.name,
            context_message_sequence=message.sequence,
            model="scripted",
            options=turn_options(agent, trigger_message_id=message.id, context={}),
            submitted_at=utcnow(),
        )


def running_turn_record(options: TurnOptions) -> TurnRecord:
    """A running root turn's record with ``options``, built in memory (for the kernel's functions of a record)."""
    now = utcnow()
    return TurnRecord(
        id="turn_root",
        conversation_id="conversation_x",
        agent_name="a",
        root_turn_id="turn_root",
        context_message_sequence=1,
        status="running",
        options=options,
        created_at=now,
        updated_at=now,
    )
