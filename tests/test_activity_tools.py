"""Your activities as tools (``turnkit.activity_tool``).

The team's activities are served by the team's own worker on a task queue of its own: a plain ``temporalio`` worker
on a client of its own, with the pydantic converter and no TurnKit plugin, beside the turn's worker of the ``tk``
fixture. The agent's model is scripted; every call runs as the team's activity, with TurnKit's execution record,
budgets and recovery rules around it.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
import pytest_asyncio
from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RawValue, RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

import turnkit
from tests.engine import Engine
from turnkit._temporal.replay import turnkit_replayer
from turnkit.kernel.records import INTERRUPTED_MESSAGE
from turnkit.model import ModelRequest, Result
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools


class OrderQuery(BaseModel):
    order_id: str = Field(description="The order's id, as the customer gives it.")
    with_lines: bool = False


class Order(BaseModel):
    order_id: str
    status: str
    lines: list[str] = Field(default_factory=list[str])


@dataclass
class Orders:
    """The team's order activities (bound methods of one object, as a team registers an activity class), with what
    each call saw: the activity's name, its arguments, the queue it ran on and the attempt."""

    calls: list[tuple[str, Any, str, int]] = field(default_factory=list[tuple[str, Any, str, int]])
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def _record(self, name: str, arguments: Any) -> None:
        info = activity.info()
        self.calls.append((name, arguments, info.task_queue, info.attempt))

    @activity.defn(name="orders.lookup")
    async def lookup(self, query: OrderQuery) -> Order:
        """Look up an order by its id."""
        self._record("orders.lookup", query.model_dump())
        return Order(order_id=query.order_id, status="shipped", lines=["tea"] if query.with_lines else [])

    @activity.defn(name="orders.refund")
    async def refund(self, order_id: str, amount: float, reason: str = "damaged") -> dict[str, Any]:
        """Refund part of an order.

        Args:
            order_id: The order.
            amount: How much, in euros.
            reason: Why.
        """
        self._record("orders.refund", [order_id, amount, reason])
        if activity.info().attempt == 1:
            raise RuntimeError("the payment service blinked")
        return {"refunded": amount, "order_id": order_id}

    @activity.defn(name="orders.cancel")
    async def cancel(self, order_id: str) -> str:
        """Cancel an order (its first attempt never answers in time)."""
        self._record("orders.cancel", order_id)
        await self.release.wait()
        return "cancelled"

    @activity.defn(name="orders.close")
    async def close(self, order_id: str) -> str:
        """Close an order."""
        self._record("orders.close", order_id)
        raise ValueError(f"order {order_id} is still open")

    def ran(self, name: str) -> list[tuple[Any, str, int]]:
        """The calls of the activity ``name``: arguments, queue, attempt."""
        return [(arguments, queue, attempt) for each, arguments, queue, attempt in self.calls if each == name]


@dataclass
class Team:
    """The team's worker: its queue and its activities."""

    queue: str
    orders: Orders


@pytest_asyncio.fixture
async def team(engine: Engine) -> AsyncIterator[Team]:
    """The team's own worker, on its own queue and client (pydantic converter, no TurnKit)."""
    client = await Client.connect(engine.temporal_address, data_converter=pydantic_data_converter)
    orders = Orders()
    queue = f"team-{uuid.uuid4().hex[:12]}"
    activities = [orders.lookup, orders.refund, orders.cancel, orders.close]
    try:
        async with Worker(client, task_queue=queue, activities=activities):
            yield Team(queue=queue, orders=orders)
    finally:
        orders.release.set()  # a call still held (a lost attempt) ends with the worker


def answer_with_last_result(request: ModelRequest) -> Result:
    """The final answer: the text of the tool result the model received last."""
    return Result.build(text=str(request.messages[-1]["content"]))


async def test_an_activity_on_the_teams_queue_runs_as_a_tool(tk: TurnKit, team: Team) -> None:
    """The model's call runs as the team's own activity (its registered name, on its queue, in the team's worker),
    with the pydantic model's fields as the tool's arguments; the call is recorded as a completed tool execution
    whose result the model reads; the history holds the activity under its own name and replays as it ran."""
    lookup = turnkit.activity_tool(team.orders.lookup, task_queue=team.queue)
    client = ScriptedClient([call_tools(("lookup", {"order_id": "A-1", "with_lines": True})), answer_with_last_result])
    agent = turnkit.Agent("support", model="scripted", tools=[lookup], client=client)

    turn = await (await tk.conversation(agent)).ask("where is my order A-1?")

    assert turn.status == "completed", turn.error
    [spec] = client.requests[0].tools
    assert (spec.name, spec.description) == ("lookup", "Look up an order by its id.")
    assert spec.parameters["required"] == ["order_id"]
    assert set(spec.parameters["properties"]) == {"order_id", "with_lines"}
    assert team.orders.ran("orders.lookup") == [({"order_id": "A-1", "with_lines": True}, team.queue, 1)]
    [execution] = await turn.tool_executions()
    assert (execution.tool_name, execution.status) == ("lookup", "completed")
    assert execution.result == {"order_id": "A-1", "status": "shipped", "lines": ["tea"]}
    assert json.loads(turn.output_text or "") == execution.result

    history = await tk.client.get_workflow_handle(turn.id).fetch_history()
    scheduled = [
        (e.activity_task_scheduled_event_attributes.activity_type.name, e.activity_task_scheduled_event_attributes)
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    [(_, attributes)] = [each for each in scheduled if each[0] == "orders.lookup"]
    assert attributes.task_queue.name == team.queue
    assert attributes.retry_policy.maximum_attempts == 1  # at most once, the default
    await turnkit_replayer().replay_workflow(history)


async def test_a_replay_safe_activity_that_fails_once_is_retried_and_completes(tk: TurnKit, team: Team) -> None:
    """A replay-safe activity tool runs with its own retry policy: its first attempt fails, Temporal retries it in
    the team's worker, and the one execution completes with the second attempt's result. Several parameters: one
    argument each, described by the docstring's ``Args``."""
    refund = turnkit.activity_tool(
        team.orders.refund,
        task_queue=team.queue,
        recovery="replay_safe",
        retry_policy=RetryPolicy(initial_interval=timedelta(milliseconds=50), maximum_attempts=3),
    )
    client = ScriptedClient([call_tools(("refund", {"order_id": "A-2", "amount": 4.5})), "refunded"])
    agent = turnkit.Agent("support", model="scripted", tools=[refund], client=client)

    turn = await (await tk.conversation(agent)).ask("refund A-2, the cup was broken")

    assert turn.status == "completed", turn.error
    [spec] = client.requests[0].tools
    assert spec.parameters["properties"]["amount"]["description"] == "How much, in euros."
    assert team.orders.ran("orders.refund") == [
        (["A-2", 4.5, "damaged"], team.queue, 1),
        (["A-2", 4.5, "damaged"], team.queue, 2),
    ]
    [execution] = await turn.tool_executions()
    assert execution.status == "completed"
    assert execution.result == {"refunded": 4.5, "order_id": "A-2"}


async def test_an_at_most_once_activity_whose_attempt_is_lost_is_interrupted_and_never_run_again(
    tk: TurnKit, team: Team
) -> None:
    """An at-most-once activity tool has one attempt: when it is lost (it never answers within its start-to-close
    timeout), the call is recorded ``interrupted`` (outcome unknown), the model is told so, the turn goes on, and the
    activity is never scheduled again."""
    cancel = turnkit.activity_tool(
        team.orders.cancel, task_queue=team.queue, start_to_close_timeout=timedelta(seconds=1)
    )
    client = ScriptedClient([call_tools(("cancel", {"order_id": "A-3"})), answer_with_last_result])
    agent = turnkit.Agent("support", model="scripted", tools=[cancel], client=client)

    turn = await (await tk.conversation(agent)).ask("cancel A-3")

    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "interrupted"
    assert INTERRUPTED_MESSAGE in (turn.output_text or "")
    history = await tk.client.get_workflow_handle(turn.id).fetch_history()
    attempts = [
        e
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "orders.cancel"
    ]
    assert len(attempts) == 1
    assert team.orders.ran("orders.cancel") == [("A-3", team.queue, 1)]


async def test_an_at_most_once_activity_that_raises_fails_its_call(tk: TurnKit, team: Team) -> None:
    """An at-most-once activity that raises has a known outcome: the call is ``failed`` (not interrupted) with the
    activity's error as what the model reads, and it ran once."""
    close = turnkit.activity_tool(team.orders.close, task_queue=team.queue)
    client = ScriptedClient([call_tools(("close", {"order_id": "A-4"})), answer_with_last_result])
    agent = turnkit.Agent("support", model="scripted", tools=[close], client=client)

    turn = await (await tk.conversation(agent)).ask("close A-4")

    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "failed"
    assert "order A-4 is still open" in str((execution.error or {}).get("message"))
    assert len(team.orders.ran("orders.close")) == 1


async def test_activity_tools_count_against_the_tool_budget(tk: TurnKit, team: Team) -> None:
    """Each call is a tool execution of the turn's tree: with ``max_tool_executions=1`` the second proposed call is
    denied before its activity is scheduled, and the turn fails with the budget error."""
    lookup = turnkit.activity_tool(team.orders.lookup, task_queue=team.queue)
    client = ScriptedClient([call_tools(("lookup", {"order_id": "B-1"}), ("lookup", {"order_id": "B-2"}))])
    agent = turnkit.Agent("support", model="scripted", tools=[lookup], client=client, max_tool_executions=1)

    turn = await (await tk.conversation(agent)).ask("look up both")

    assert turn.status == "failed"
    assert turn.error is not None and turn.error["message"] == "maximum tool executions reached"
    assert [arguments for arguments, _, _ in team.orders.ran("orders.lookup")] == [
        {"order_id": "B-1", "with_lines": False}
    ]
    first, second = sorted(await turn.tool_executions(), key=lambda e: e.created_at)
    assert (first.status, second.status) == ("completed", "failed")


async def test_invalid_arguments_fail_the_call_before_the_activity_runs(tk: TurnKit, team: Team) -> None:
    """The model's arguments are validated against the activity's signature in TurnKit's worker: invalid ones fail
    the call with the reason the model reads, and the team's activity is never scheduled."""
    lookup = turnkit.activity_tool(team.orders.lookup, task_queue=team.queue)
    client = ScriptedClient([call_tools(("lookup", {"id": "C-1"})), answer_with_last_result])
    agent = turnkit.Agent("support", model="scripted", tools=[lookup], client=client)

    turn = await (await tk.conversation(agent)).ask("look it up")

    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "failed"
    assert "unknown argument(s): id" in (turn.output_text or "")
    assert team.orders.ran("orders.lookup") == []


@activity.defn
async def quote(sku: str, count: int = 1) -> dict[str, Any]:
    """Price some units of a product."""
    return {"sku": sku, "count": count}


@activity.defn(dynamic=True)
async def anything(args: Sequence[RawValue]) -> None:
    """A dynamic activity."""


def test_the_definition_follows_the_activity() -> None:
    """A function's name and docstring name and describe the tool, its parameters are the arguments (in order, with
    their defaults); the policy the model activity resolves names the activity, its queue, timeouts and retries."""
    priced = turnkit.activity_tool(
        quote,
        task_queue="pricing",
        start_to_close_timeout=timedelta(seconds=5),
        heartbeat_timeout=timedelta(seconds=2),
        recovery="replay_safe",
        retry_policy=RetryPolicy(maximum_attempts=7, backoff_coefficient=3.0, non_retryable_error_types=["Bad"]),
    )
    assert (priced.name, priced.description) == ("quote", "Price some units of a product.")
    assert priced.activity_args({"sku": "tea"}) == ["tea", 1]
    policy = priced.call_policy()
    assert (policy.kind, policy.task_queue, policy.timeout, policy.max_attempts) == ("activity", "pricing", 5.0, 7)
    assert policy.activity is not None
    assert (policy.activity.activity_type, policy.activity.heartbeat) == ("quote", 2.0)
    assert (policy.activity.backoff_coefficient, policy.activity.non_retryable_error_types) == (3.0, ["Bad"])
    assert turnkit.activity_tool(quote).call_policy().max_attempts == 1  # at most once by default


def test_what_cannot_be_an_activity_tool() -> None:
    """Only a named ``@activity.defn`` (function or bound method) can; an at-most-once tool takes no retries."""
    with pytest.raises(TypeError, match=r"@activity\.defn"):
        turnkit.activity_tool(lambda: None)
    with pytest.raises(TypeError, match="dynamic"):
        turnkit.activity_tool(anything)
    with pytest.raises(TypeError, match="bound method"):
        turnkit.activity_tool(Orders.lookup)
    with pytest.raises(ValueError, match="recovery='replay_safe'"):
        turnkit.activity_tool(quote, retry_policy=RetryPolicy(maximum_attempts=3))
    with pytest.raises(ValueError, match="task_queue"):
        turnkit.activity_tool(quote, task_queue=" ")
