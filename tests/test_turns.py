"""The turn loop on a real Temporal dev server and real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

import turnkit
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool(recovery="replay_safe")
def lookup(q: str) -> dict[str, Any]:
    """Look something up.

    Args:
        q: The query.
    """
    return {"answer": q.upper()}


@turnkit.tool
def boom(reason: str) -> dict[str, Any]:
    """Always fails with a ToolError."""
    raise turnkit.ToolError(f"boom: {reason}")


def agent(client: ScriptedClient, **limits: Any) -> turnkit.Agent:
    return turnkit.Agent("tester", model="scripted", tools=[lookup, boom], client=client, **limits)


async def test_three_iteration_tool_turn(tk: TurnKit) -> None:
    client = ScriptedClient(
        [
            call_tools(("lookup", {"q": "a"}), ("lookup", {"q": "b"})),
            call_tools(("lookup", {"q": "c"})),
            "all done",
        ]
    )
    conversation = await tk.conversation(agent(client))
    turn = await conversation.ask("look things up")

    assert turn.status == "completed", turn.error
    assert turn.output_text == "all done"
    messages = await conversation.messages()
    assert [m.sequence for m in messages] == list(range(1, len(messages) + 1))
    assert [(m.role, m.kind) for m in messages] == [
        ("user", "text"),
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("tool", "tool_result"),
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("assistant", "text"),
    ]
    executions = await turn.tool_executions()
    assert [e.status for e in executions] == ["completed"] * 3
    assert [e.result for e in executions] == [{"answer": "A"}, {"answer": "B"}, {"answer": "C"}]
    assert client.calls == 3
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (30, 15)  # 10 + 5 tokens per scripted call
    assert turn.usage.total_tokens > 0
    assert turn.record.state["iterations"] == 3
