"""The control boundary between building a model request and calling the model (behaviour §5.10; the seed's
``control_boundary!`` "after building a model request and before dispatching it").

Each test holds the turn inside its automatic compaction (the summariser's call, made after the iteration was
reserved and before the request is sent), applies a control there, and proves the main model is never paid for
the request the control overtook; on a real dev server with a real store.
"""

from __future__ import annotations

import asyncio

import pytest

import turnkit
from tests.engine import eventually
from turnkit.config import configure
from turnkit.model import ModelRequest, Result
from turnkit.runtime import TurnKit

SUMMARY = "## Active Task\nThe notes."


class HeldSummary:
    """A client whose first compaction call blocks until released; the turn's own calls answer "answered"."""

    def __init__(self) -> None:
        self.entered, self.released = asyncio.Event(), asyncio.Event()
        self.main: list[ModelRequest] = []

    async def chat(self, request: ModelRequest) -> Result:
        if request.metadata.get("compaction"):
            self.entered.set()
            await self.released.wait()
            return Result.build(text=SUMMARY)
        self.main.append(request)
        return Result.build(text="answered")


async def held_turn(tk: TurnKit, name: str) -> tuple[HeldSummary, turnkit.Turn]:
    """A turn of a fresh agent, held in its forced compaction."""
    client = HeldSummary()
    agent = turnkit.Agent(name, model="scripted", client=client, compaction={"tail_messages": 1})
    conversation = await tk.conversation(agent)
    for i in range(3):
        await conversation.say(f"note {i}")
    turn = await conversation.ask("go", compact=True, wait=False)
    await asyncio.wait_for(client.entered.wait(), 30)
    return client, turn


async def test_a_pause_during_compaction_pays_no_model_call(tk: TurnKit) -> None:
    """A pause requested while the request is being prepared (its compaction running) is acknowledged before the
    model is asked: the turn pauses with no main call made, the summary kept; resumed, it asks once and completes.
    The reserved iteration stays spent, as in the seed."""
    client, turn = await held_turn(tk, "paused_in_compaction")
    await turn.pause()
    client.released.set()

    async def paused() -> bool:
        return (await turn.refresh()).status == "paused"

    await eventually(paused, what="the turn paused at the boundary before the model call")
    assert client.main == []  # the request the pause overtook was never sent
    assert [m.kind for m in await turn.messages()].count("context_summary") == 1  # the compaction's work is kept
    await turn.resume()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "answered", done.error
    assert len(client.main) == 1
    assert done.record.options.state.iterations == 2


async def test_steering_during_compaction_reaches_the_first_model_call(tk: TurnKit) -> None:
    """Steering that arrives while the request is being prepared is applied before the model is asked: the one main
    call the turn makes already carries it (no call is paid for the superseded request)."""
    client, turn = await held_turn(tk, "steered_in_compaction")
    [receipt] = await turn.steer("use the filings", key="s-1")
    client.released.set()
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "answered", done.error
    [request] = client.main
    assert "use the filings" in [m.get("content") for m in request.messages]
    [applied] = (await done.control_state())["controls"]["inputs"]
    assert applied["id"] == receipt["id"] and applied["request_id"] == request.metadata["request_id"]


@pytest.mark.usefixtures("through_lanes")
async def test_a_cancel_during_a_local_model_calls_compaction_pays_no_model_call(tk: TurnKit) -> None:
    """A model call run as a local activity sends no heartbeat, so a cancel reaches it only through the store: one
    that lands during its compaction stops it at the boundary, and the main model is never asked."""
    configure(model_local_activity=True)
    client, turn = await held_turn(tk, "cancelled_in_compaction")
    await turn.cancel()
    client.released.set()
    done = await turn.result(timeout=60)
    assert done.status == "cancelled"

    async def workflow_closed() -> bool:
        description = await tk.client.get_workflow_handle(turn.id).describe()
        return description.close_time is not None

    await eventually(workflow_closed, what="the turn's workflow to end")
    assert client.main == []
