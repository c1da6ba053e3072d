"""Repeated and empty tool-call ids (issue 8 item 8): every call runs and gets its own result.

A model that numbers its calls per response (``call_0`` every time) or sends no ids at all must not make a later
call reuse an earlier call's execution; the provider still gets its own ids back when the history is replayed.
"""

from __future__ import annotations

from typing import Any

import turnkit
from turnkit._engine.call_ids import provider_call_ids, unique_call_ids
from turnkit.model import ModelRequest, Result
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient

runs: list[str] = []


@turnkit.tool
def lookup(q: str) -> dict[str, Any]:
    """Look something up."""
    runs.append(q)
    return {"answer": q.upper()}


def call(call_id: str, q: str) -> dict[str, Any]:
    return {"id": call_id, "name": "lookup", "arguments": {"q": q}}


def test_unique_call_ids_keeps_new_ids_and_renames_repeated_and_empty_ones() -> None:
    parts = [
        {"type": "text", "text": "x"},
        {"type": "tool_call", "id": "call_0", "name": "a", "arguments": {}},
        {"type": "tool_call", "id": "call_0", "name": "b", "arguments": {}},
        {"type": "tool_call", "id": "", "name": "c", "arguments": {}},
        {"type": "tool_call", "id": "call_9", "name": "d", "arguments": {}},
    ]
    renamed = unique_call_ids(parts, taken=["call_0_1"])
    assert [p.get("id") for p in renamed] == [None, "call_0", "call_0_2", "call_1", "call_9"]
    assert [p.get("provider_id") for p in renamed] == [None, None, "call_0", "", None]
    assert parts[2]["id"] == "call_0"  # the input is not mutated


def test_provider_call_ids_pairs_results_with_the_providers_ids() -> None:
    projected = [
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "name": "a", "arguments": {}}]},
        {"role": "tool", "content": "A", "tool_call_id": "call_0"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "call_0_1", "provider_id": "call_0", "name": "a", "arguments": {}}],
        },
        {"role": "tool", "content": "B", "tool_call_id": "call_0_1"},
    ]
    replayed = provider_call_ids(projected)
    assert [m.get("tool_call_id") or m["tool_calls"][0]["id"] for m in replayed] == ["call_0"] * 4
    assert "provider_id" not in replayed[2]["tool_calls"][0]


async def test_call_0_in_every_response_runs_each_call(tk: TurnKit) -> None:
    """Issue 8 item 8: `call_0` in two iterations and twice in one response: three executions, three results."""
    runs.clear()
    client = ScriptedClient(
        [
            Result.build(tool_calls=[call("call_0", "a")]),
            Result.build(tool_calls=[call("call_0", "b"), call("call_0", "c")]),
            "done",
        ]
    )
    conversation = await tk.conversation(turnkit.Agent("ids", model="scripted", tools=[lookup], client=client))
    turn = await conversation.ask("look up a, b and c")

    assert turn.status == "completed", turn.error
    assert runs == ["a", "b", "c"]  # each call ran; none reused an earlier execution
    executions = await turn.tool_executions()
    assert [(e.tool_call_id, e.status, e.result) for e in executions] == [
        ("call_0", "completed", {"answer": "A"}),
        ("call_0_1", "completed", {"answer": "B"}),
        ("call_0_2", "completed", {"answer": "C"}),
    ]
    # The provider gets its own ids back, each result right after the response that asked for it.
    last = client.requests[-1].messages
    replayed = [(m["role"], [c["id"] for c in m.get("tool_calls", [])] or m.get("tool_call_id")) for m in last[1:]]
    assert replayed == [
        ("assistant", ["call_0"]),
        ("tool", "call_0"),
        ("assistant", ["call_0", "call_0"]),
        ("tool", "call_0"),
        ("tool", "call_0"),
    ]
    contents = [m["content"] for m in last if m["role"] == "tool"]
    assert [next(letter for letter in "ABC" if letter in c) for c in contents] == ["A", "B", "C"]


class EmptyIds:
    """A model client that sends tool calls without ids (ScriptedClient would fill them in)."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def chat(self, request: ModelRequest) -> Result:
        self.requests.append(request)
        if len(self.requests) == 1:
            return Result.build(tool_calls=[call("", "x"), call("", "y")])
        if len(self.requests) == 2:
            return Result.build(tool_calls=[call("", "z")])
        return Result.build(text="done")


async def test_empty_ids_get_their_own_executions(tk: TurnKit) -> None:
    """Issue 8 item 8: calls without an id each run and get their own result."""
    runs.clear()
    client = EmptyIds()
    conversation = await tk.conversation(turnkit.Agent("ids", model="scripted", tools=[lookup], client=client))
    turn = await conversation.ask("look up x, y and z")

    assert turn.status == "completed", turn.error
    assert runs == ["x", "y", "z"]
    executions = await turn.tool_executions()
    assert [(e.tool_call_id, e.result) for e in executions] == [
        ("call_1", {"answer": "X"}),
        ("call_2", {"answer": "Y"}),
        ("call_3", {"answer": "Z"}),
    ]
    # An empty provider id cannot pair a result: the provider sees TurnKit's ids, consistently.
    last = client.requests[-1].messages
    assert [m.get("tool_call_id") for m in last if m["role"] == "tool"] == ["call_1", "call_2", "call_3"]
