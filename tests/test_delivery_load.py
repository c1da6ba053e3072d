"""Deliveries under load and across continue-as-new (real dev server; SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from itertools import pairwise

import pytest

import turnkit
from tests.engine import eventually, held_tool
from turnkit.kernel.payloads import LaneStatus
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools

pytestmark = pytest.mark.slow


async def test_concurrent_senders_while_busy(tk: TurnKit) -> None:
    release, hold = held_tool()

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        if request.messages[-1]["content"] == "start":
            return call_tools(("hold", {}))
        return turnkit.Result.build(text="ok")

    client = ScriptedClient(script)
    conversation = await tk.conversation(turnkit.Agent("inbox", model="scripted", tools=[hold], client=client))
    first = await conversation.ask("start", wait=False)

    # 4 senders, 50 posts each: 150 distinct keys, 50 of them posted twice (by two different senders).
    keys = [f"key-{i}" for i in range(150)]
    plan = keys + keys[:50]
    senders = [plan[s::4] for s in range(4)]

    async def send(batch: list[str]) -> None:
        for key in batch:
            await conversation.post(f"message {key}", key=key)

    await asyncio.gather(*(send(batch) for batch in senders))
    release.set()
    await first.result(timeout=60)

    async def settled() -> bool:
        turns = [t.record for t in await conversation.turns()]
        applied = [m for m in await conversation.messages() if m.metadata.get("delivery_id")]
        consumed = max(t.context_message_sequence for t in turns)
        return (
            len(applied) == 150
            and all(t.terminal for t in turns)
            and all(m.sequence <= consumed for m in applied)  # every delivery consumed by some turn
        )

    await eventually(settled, timeout=120, what="all 150 deliveries to be applied and consumed")
    messages = await conversation.messages()
    assert [m.sequence for m in messages] == list(range(1, len(messages) + 1))
    delivered = [m for m in messages if m.metadata.get("delivery_id")]
    assert len(delivered) == 150
    assert sorted(m.text for m in delivered) == sorted(f"message {k}" for k in keys)
    turns = [t.record for t in await conversation.turns()]
    spans = sorted((t.started_at, t.completed_at) for t in turns if t.started_at)
    for (_, end), (start, _) in pairwise(spans):
        assert end is not None and start is not None and end <= start  # never two active turns
    assert len(turns) >= 2  # the busy turn, then woken turn(s) for the buffered input


@pytest.mark.usefixtures("through_lanes")
async def test_lane_continues_as_new_over_hundreds_of_turns(tk: TurnKit) -> None:
    client = ScriptedClient(lambda request: turnkit.Result.build(text="ok"))
    conversation = await tk.conversation(turnkit.Agent("chatty", model="scripted", client=client))
    lane = tk.client.get_workflow_handle(conversation.id)
    max_events = 0
    runs: set[str] = set()
    total = 300
    for wave in range(0, total, 25):
        turns = [await conversation.ask(f"q{wave + i}", wait=False) for i in range(25)]
        await asyncio.gather(*(t.result(timeout=120) for t in turns))
        status = await lane.query("status", result_type=LaneStatus)
        max_events = max(max_events, status.run_history_events)
        runs.add((await lane.describe()).run_id or "")
    assert client.calls == total
    records = [t.record for t in await conversation.turns()]
    assert len(records) == total and all(r.status == "completed" for r in records)
    status = await lane.query("status", result_type=LaneStatus)
    assert status.turns_started == total  # carried across every continue-as-new
    assert len(runs) >= 2, "the lane never continued as new"
    assert max_events < 4096, max_events  # under Temporal's default suggestion threshold (4 Ki events)
    await eventually(lambda: _history_ok(tk, conversation.id), what="history check")


async def _history_ok(tk: TurnKit, lane_id: str) -> bool:
    history = await tk.client.get_workflow_handle(lane_id).fetch_history()
    return len(history.events) < 4096
