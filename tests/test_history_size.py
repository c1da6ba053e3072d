"""Payloads carry ids, not transcripts: a turn's history grows by a constant per iteration."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import turnkit
from tests.engine import eventually
from turnkit._engine.builtin_tools import send_message
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool(recovery="replay_safe")
def fetch_page(n: int) -> dict[str, Any]:
    """Return a large page: its text goes to the store, never into the workflow history.

    Args:
        n: Page number.
    """
    return {"page": n, "text": "lorem ipsum " * 2000}


def iterations_agent(k: int) -> turnkit.Agent:
    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        done = sum(1 for m in request.messages if m["role"] == "tool")
        if done >= k - 1:
            return turnkit.Result.build(text="finished " + "x" * 5000)
        return call_tools(("fetch_page", {"n": done}), text="reading " + "y" * 2000)

    # No compaction: ~6,000 tokens of page text per iteration would trigger it near K=14, and this script counts
    # the tool results it sees (a summary replaces them).
    return turnkit.Agent(
        f"pager{k}",
        model="scripted",
        tools=[fetch_page],
        client=ScriptedClient(script),
        max_iterations=50,
        compaction=False,
    )


async def history_bytes(tk: TurnKit, k: int) -> int:
    conversation = await tk.conversation(iterations_agent(k))
    turn = await conversation.ask("read the pages")
    assert turn.status == "completed", turn.error
    assert turn.record.options.state.iterations == k
    history = await tk.client.get_workflow_handle(turn.id).fetch_history()
    return sum(event.ByteSize() for event in history.events)


async def test_history_grows_by_a_small_constant_per_iteration(tk: TurnKit) -> None:
    sizes = {k: await history_bytes(tk, k) for k in (2, 10, 20)}
    early = (sizes[10] - sizes[2]) / 8
    late = (sizes[20] - sizes[10]) / 10
    assert late <= 1.2 * early, sizes
    assert late < 3 * 1024, sizes  # ~10 KB of page text and model output per iteration stays out of the history


@turnkit.tool(recovery="replay_safe")
def echo_note(note: str) -> str:
    """Echo a note.

    Args:
        note: The note.
    """
    return f"noted {len(note)} characters"


@pytest.mark.usefixtures("through_lanes")
async def test_tool_arguments_sub_agent_tasks_and_sent_messages_stay_out_of_every_history(tk: TurnKit) -> None:
    """Issue 9, payloads carry ids: a tool's arguments, a sub-agent's task and a ``send_message`` text reach their
    activities and the records, yet none of them is in any workflow history of the tree (lanes, turn, sub-agent)."""
    marker = uuid.uuid4().hex
    inbox_agent = turnkit.Agent("inbox", model="scripted", client=ScriptedClient(["inbox read it"]))
    inbox = await tk.conversation(inbox_agent)
    helper = turnkit.Agent(
        "helper", model="scripted", description="Does a task.", client=ScriptedClient(lambda r: "helped")
    )
    client = ScriptedClient(
        [
            call_tools(("echo_note", {"note": f"{marker}-argument"})),
            call_tools(("helper", {"task": f"{marker}-task"})),
            call_tools(("send_message", {"conversation_id": inbox.id, "text": f"{marker}-message"})),
            "all done",
        ]
    )
    lead = turnkit.Agent("lead", model="scripted", tools=[echo_note, send_message], sub_agents=[helper], client=client)
    conversation = await tk.conversation(lead)
    turn = await conversation.ask("go")
    assert turn.status == "completed" and turn.output_text == "all done", turn.error

    executions = {e.tool_name: e for e in await turn.tool_executions()}
    assert executions["echo_note"].status == "completed"
    assert executions["echo_note"].arguments == {"note": f"{marker}-argument"}
    [child] = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    assert child.status == "completed"
    [task] = [m for m in await tk.store.list_messages(child.conversation_id) if m.role == "user"]
    assert task.text == f"{marker}-task"
    await eventually(lambda: inbox_has(tk, inbox.id, f"{marker}-message"), what="the sent message in the inbox")

    workflow_ids = [conversation.id, turn.id, child.id, inbox.id]
    for workflow_id in workflow_ids:
        history = await tk.client.get_workflow_handle(workflow_id).fetch_history()
        raw = b"".join(event.SerializeToString() for event in history.events)
        assert marker.encode() not in raw, f"content crossed a payload in {workflow_id}'s history"


async def inbox_has(tk: TurnKit, conversation_id: str, text: str) -> bool:
    return any(m.text == text for m in await tk.store.list_messages(conversation_id))
