"""Token streaming (issue 38): ``Turn.stream()`` and ``Conversation.stream()`` yield the model's deltas live, merged
with the committed events (tool calls, sub-agents, the turn's end), and the store records the answer exactly once."""

from __future__ import annotations

from typing import Any

import pytest

import turnkit
from turnkit.runtime import TurnKit
from turnkit.streaming import TurnStreamEvent
from turnkit.testing import ScriptedClient, call_tools

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


@turnkit.tool(recovery="replay_safe")
def lookup(topic: str) -> dict[str, Any]:
    """Look a topic up.

    Args:
        topic: What to look up.
    """
    return {"fact": f"{topic} is durable"}


def answer_text(events: list[TurnStreamEvent], call_id: str) -> str:
    """The text a consumer shows for ``call_id``: its deltas since its last restart."""
    text = ""
    for event in events:
        if isinstance(event, turnkit.Restart) and event.call_id == call_id:
            text = ""
        elif isinstance(event, turnkit.TextDelta) and event.call_id == call_id:
            text += event.text
    return text


@sqlite_only
async def test_a_turn_streams_its_deltas_in_process_on_sqlite(tk: TurnKit) -> None:
    """SQLite, worker and client in one process: the answer arrives word by word while the turn runs, the tool call
    starts and finishes between the two model calls, and the stream ends with the recorded answer."""
    answer = "Temporal keeps the turn durable, word by word."
    client = ScriptedClient([call_tools(("lookup", {"topic": "temporal"}), text="Looking."), answer], delta_delay=0.02)
    agent = turnkit.Agent("streamer", model="scripted", tools=[lookup], client=client)
    turn = await (await tk.conversation(agent)).ask("what is temporal?", wait=False)

    events: list[TurnStreamEvent] = []
    running_at_first_delta: bool | None = None
    async for event in turn.stream():
        if isinstance(event, turnkit.TextDelta) and running_at_first_delta is None:
            running_at_first_delta = not (await tk.store.load_turn(turn.id)).terminal
        events.append(event)

    assert running_at_first_delta is True  # live: the first words came before the turn ended
    ended = events[-1]
    assert isinstance(ended, turnkit.TurnEnded) and ended.status == "completed" and ended.output_text == answer
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("ToolCallStarted") < kinds.index("ToolCallFinished")
    calls = list(dict.fromkeys(e.call_id for e in events if isinstance(e, turnkit.TextDelta)))
    assert len(calls) == 2  # both model calls streamed
    assert answer_text(events, calls[0]) == "Looking."
    assert answer_text(events, calls[1]) == answer
    assert len([e for e in events if isinstance(e, turnkit.TextDelta) and e.call_id == calls[1]]) > 3
    assert not any(isinstance(e, turnkit.Restart) for e in events)
    # A turn that already ended streams its end at once.
    assert [type(e).__name__ for e in [e async for e in turn.stream()]][-1] == "TurnEnded"
