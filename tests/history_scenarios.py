"""Deterministic scenarios whose Temporal histories are recorded (``make histories``) and replayed (test_replay).

Every scenario runs on a :class:`~turnkit.runtime.TurnKit` handle with a worker running, with a scripted model, and
returns the ids of the workflows whose histories are worth keeping. ``TurnWorkflow`` reads each tool's retry policy
from the agent registry, also while replaying, so the agents live here: the recorder and the replay test register the
same definitions (:func:`register_scenario_agents`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType

import turnkit
from turnkit.agent import Agent, register
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, ScriptItem, call_tools
from turnkit.tools import Tool, ToolContext

__all__ = [
    "SCENARIOS",
    "lane_two_turns",
    "register_scenario_agents",
    "scenario_agent",
    "turn_budget",
    "turn_terminal_tool",
    "turn_tool_failures",
    "turn_tools",
]

Scenario = Callable[[TurnKit], Awaitable[list[str]]]


# -- tools ------------------------------------------------------------------------------------------------------------


@turnkit.tool(recovery="replay_safe")
def lookup(q: str) -> dict[str, Any]:
    """Look something up.

    Args:
        q: The query.
    """
    return {"answer": q.upper()}


@turnkit.tool
def notify(message: str) -> dict[str, Any]:
    """Send a notification (at most once).

    Args:
        message: What to send.
    """
    return {"sent": message}


@turnkit.tool
def boom(reason: str) -> dict[str, Any]:
    """Always fails with a ToolError.

    Args:
        reason: Why.
    """
    raise turnkit.ToolError(f"boom: {reason}")


class SaveReport(Tool):
    """A terminal tool: a completed call ends the turn with "Saved."."""

    description = "Save the final report."
    terminal = "Saved."

    class Arguments(BaseModel):
        title: str

    def call(self, context: ToolContext, *, title: str) -> dict[str, Any]:
        return {"id": f"report-{title}"}


# -- agents -----------------------------------------------------------------------------------------------------------

TOOLS_AGENT = "history_tools"
FAILURES_AGENT = "history_failures"
BUDGET_AGENT = "history_budget"
LANE_AGENT = "history_lane"
TERMINAL_AGENT = "history_terminal"

#: Agent name -> (tools, limits). The definitions must not change once histories are recorded with them.
_AGENTS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    TOOLS_AGENT: ((lookup, notify), {}),
    FAILURES_AGENT: ((lookup, boom), {}),
    BUDGET_AGENT: ((lookup,), {"max_iterations": 1}),
    LANE_AGENT: ((lookup,), {}),
    TERMINAL_AGENT: ((SaveReport, lookup), {}),
}


def scenario_agent(name: str, client: ScriptedClient | None = None) -> Agent:
    """A scenario agent; ``client`` is only needed to run it (replay never calls the model)."""
    tools, limits = _AGENTS[name]
    return Agent(name, model="scripted", tools=tools, client=client, **limits)


def register_scenario_agents() -> None:
    """Register every scenario agent (without a model client); safe to call repeatedly."""
    for name in _AGENTS:
        register(scenario_agent(name))


# -- helpers ----------------------------------------------------------------------------------------------------------


async def _conversation(tk: TurnKit, agent_name: str, script: list[ScriptItem]) -> turnkit.Conversation:
    return await tk.conversation(scenario_agent(agent_name, ScriptedClient(script)))


async def _lane_settled(tk: TurnKit, conversation_id: str, turns: int, *, timeout: float = 30.0) -> None:
    """Wait until the lane has seen ``turns`` children complete and has no workflow task in flight.

    Then its (still running) history ends at a completed workflow task, and a recording does not depend on timing.
    """
    handle = tk.client.get_workflow_handle(conversation_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        events = (await handle.fetch_history()).events
        completed = sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED)
        if completed >= turns and events[-1].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return
        if loop.time() > deadline:
            raise AssertionError(f"lane {conversation_id} did not settle after {turns} turn(s)")
        await asyncio.sleep(0.05)


# -- scenarios --------------------------------------------------------------------------------------------------------


async def turn_tools(tk: TurnKit) -> list[str]:
    """Three iterations: a replay-safe tool twice, then an at-most-once tool, then a final answer."""
    conversation = await _conversation(
        tk,
        TOOLS_AGENT,
        [
            call_tools(("lookup", {"q": "a"}), ("lookup", {"q": "b"})),
            call_tools(("notify", {"message": "found A and B"})),
            "all done",
        ],
    )
    turn = await conversation.ask("look things up, then tell someone")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "all done"
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [
        ("lookup", "completed"),
        ("lookup", "completed"),
        ("notify", "completed"),
    ]
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id, conversation.id]


async def turn_tool_failures(tk: TurnKit) -> list[str]:
    """A ToolError, arguments of the wrong type and an unknown tool, then a final answer."""
    conversation = await _conversation(
        tk,
        FAILURES_AGENT,
        [
            call_tools(("boom", {"reason": "on purpose"}), ("lookup", {"q": 123}), ("no_such_tool", {})),
            "recovered",
        ],
    )
    turn = await conversation.ask("try everything")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "recovered"
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [
        ("boom", "failed"),
        ("lookup", "failed"),
        ("no_such_tool", "failed"),
    ]
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def turn_budget(tk: TurnKit) -> list[str]:
    """``max_iterations=1`` and a tool call: the second model request is denied and the turn fails."""
    conversation = await _conversation(tk, BUDGET_AGENT, [call_tools(("lookup", {"q": "a"})), "never reached"])
    turn = await conversation.ask("use a tool")
    assert turn.status == "failed"
    assert turn.error is not None and turn.error.get("message") == "maximum iterations reached", turn.error
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def lane_two_turns(tk: TurnKit) -> list[str]:
    """Two turns submitted at once to one conversation run one after the other; keeps the (open) lane history."""
    conversation = await _conversation(
        tk, LANE_AGENT, [call_tools(("lookup", {"q": "first"})), "first done", "second done"]
    )
    first = await conversation.ask("first", wait=False)
    second = await conversation.ask("second", wait=False)
    first, second = await first.result(timeout=60), await second.result(timeout=60)
    assert (first.status, first.output_text) == ("completed", "first done"), first.error
    assert (second.status, second.output_text) == ("completed", "second done"), second.error
    await _lane_settled(tk, conversation.id, 2)
    return [conversation.id]


async def turn_terminal_tool(tk: TurnKit) -> list[str]:
    """A terminal tool ends the turn with its message; the sibling call after it is skipped."""
    conversation = await _conversation(
        tk, TERMINAL_AGENT, [call_tools(("save_report", {"title": "q3"}), ("lookup", {"q": "skipped"}))]
    )
    turn = await conversation.ask("save the report")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "Saved."
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [("save_report", "completed"), ("lookup", "cancelled")]
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


#: Scenario name (the prefix of its history files) -> scenario.
SCENARIOS: dict[str, Scenario] = {
    "turn-tools": turn_tools,
    "turn-tool-failures": turn_tool_failures,
    "turn-budget": turn_budget,
    "lane-two-turns": lane_two_turns,
    "turn-terminal-tool": turn_terminal_tool,
}
