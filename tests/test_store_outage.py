"""A real PostgreSQL outage while a model call and an at-most-once tool are in flight (issue 8 item 3).

The store is a private PostgreSQL cluster that the test stops (``pg_ctl stop -m immediate``: open connections
break) and starts again. Before the fix the model activity's five attempts ran out in ~15 s of outage and the
turn failed, and the at-most-once tool whose body had run was recorded ``failed`` with the connection error and
was called again by the model: two charges. Now the store phases wait for the database inside the attempt.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

import turnkit
from tests.engine import Gate, HeldModel, gated_tool
from tests.faults import PrivateCluster, private_cluster
from turnkit.model import ModelRequest, Result
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools, image

pytestmark = pytest.mark.slow  # a private cluster of its own: never the shared PostgreSQL

#: Longer than the model activity's whole retry budget before the fix (5 attempts, 1 s doubling: ~15 s);
#: ``TURNKIT_OUTAGE_SECONDS=30`` gives the issue's 30 s.
OUTAGE_SECONDS = float(os.environ.get("TURNKIT_OUTAGE_SECONDS", "20"))


@pytest.fixture
def cluster() -> AsyncIterator[PrivateCluster]:
    try:
        with private_cluster() as running:
            yield running
    except RuntimeError as err:  # no server binaries on this machine
        pytest.skip(str(err))


@pytest_asyncio.fixture
async def outage_tk(temporal: WorkflowEnvironment, cluster: PrivateCluster) -> AsyncIterator[TurnKit]:
    """A TurnKit engine whose store is the private cluster, with an in-process worker."""
    store = await Store.open(cluster.url())
    client = await Client.connect(temporal.client.service_client.config.target_host, plugins=[TurnKitPlugin(store)])
    tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
    try:
        async with tk.worker():
            yield tk
    finally:
        await store.close()


charges: list[int] = []  # the card's real effects, counted outside the store


class ChargingModel:
    """Asks for one charge; asks again only if the tool result says the charge did not go through."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def chat(self, request: ModelRequest) -> Result:
        self.requests.append(request)
        results = [m for m in request.messages if m["role"] == "tool"]
        if not results or "charged" not in str(results[-1]["content"]):
            return call_tools(("charge_card", {"amount": 5}))
        return Result.build(text="charged once")


async def test_turns_survive_a_store_outage_and_the_card_is_charged_once(
    outage_tk: TurnKit, cluster: PrivateCluster
) -> None:
    """Issue 8 item 3: PostgreSQL down 20 s with a model call and a charge in flight: both turns complete, the card
    is charged once and its execution is completed, no model call is repeated, and an ask made during the outage
    completes once the database is back."""
    charges.clear()
    gate = Gate()

    @turnkit.tool
    async def charge_card(amount: int) -> dict[str, Any]:
        """Charge the card (at most once: the default recovery)."""
        gate.runs += 1
        gate.entered.set()
        await gate.opened.wait()
        charges.append(amount)
        return {"charged": amount}

    held = HeldModel(Result.build(text="answered through the outage"))
    answering = await outage_tk.conversation(turnkit.Agent("answering", model="scripted", client=held))
    charging_model = ChargingModel()
    charging = await outage_tk.conversation(
        turnkit.Agent("charging", model="scripted", tools=[charge_card], client=charging_model)
    )
    late = await outage_tk.conversation(turnkit.Agent("late", model="scripted", client=ScriptedClient(["late answer"])))
    answer = await answering.ask("think", wait=False)
    charge = await charging.ask("charge me", wait=False)
    await asyncio.wait_for(held.entered.wait(), 30)
    await asyncio.wait_for(gate.entered.wait(), 30)

    await asyncio.to_thread(cluster.stop)
    held.released.set()  # the model answers, and the charge happens, while the database is away
    gate.opened.set()
    # Submitted during the outage: the lane's store activities (STORE_RETRY) wait for the database too.
    submitted = asyncio.create_task(late.ask("asked during the outage"))
    await asyncio.sleep(OUTAGE_SECONDS)  # the outage itself: its length is the fault being tested
    await asyncio.to_thread(cluster.start)

    answered = await answer.result(timeout=120)
    charged = await charge.result(timeout=120)

    assert answered.status == "completed", answered.error
    assert answered.output_text == "answered through the outage"
    assert len(held.requests) == 1  # the paid response was recorded, never requested again
    assert charged.status == "completed", charged.error
    assert charges == [5]  # the card was charged exactly once
    [execution] = await charged.tool_executions()
    assert execution.status == "completed" and execution.result == {"charged": 5}  # the obtained result, recorded
    assert gate.runs == 1
    assert len(charging_model.requests) == 2  # the call, then the answer: the model saw the charge go through
    late_turn = await asyncio.wait_for(submitted, 120)
    assert late_turn.status == "completed" and late_turn.output_text == "late answer"


async def test_waiting_for_a_turn_waits_out_a_store_blink(outage_tk: TurnKit, cluster: PrivateCluster) -> None:
    """Issue 8 item 3 (client side): ``Turn.result()`` and ``refresh()`` called while PostgreSQL is down wait for it
    instead of raising the driver's error (chaos seed 10 found ``ask`` raising ``ConnectionRefusedError``)."""
    gate = Gate()
    slow = gated_tool(gate)

    def script(request: ModelRequest) -> Result:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"] == "slow":
            return call_tools(("slow", {}))
        return Result.build(text=f"answered {last['content']}")

    conversation = await outage_tk.conversation(
        turnkit.Agent("blinking", model="scripted", tools=[slow], client=ScriptedClient(script))
    )
    first = await conversation.ask("slow", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    queued = await conversation.ask("next", wait=False)  # no workflow yet: result() asks the store
    await asyncio.to_thread(cluster.stop)
    try:
        waiting = asyncio.create_task(queued.result(timeout=90))
        refreshing = asyncio.create_task(first.refresh())
        await asyncio.sleep(2)  # the outage itself: both calls must still be waiting, not failed
        assert not waiting.done() and not refreshing.done()
    finally:
        await asyncio.to_thread(cluster.start)
    assert (await asyncio.wait_for(refreshing, 60)).status == "running"
    gate.opened.set()
    done = await waiting
    assert done.status == "completed" and done.output_text == "answered next"


async def test_a_commit_that_waits_for_the_database_does_not_spend_the_tools_timeout(
    outage_tk: TurnKit, cluster: PrivateCluster
) -> None:
    """Issue 36 item 5: an at-most-once tool with a 3 s timeout finishes its body in time, then PostgreSQL is down
    for longer than the tool's whole timeout while its result is committed. The commit waits for the database on
    time of its own (the activity's timeout is the tool's plus a store window; the tool's own bounds only its body):
    the call is recorded ``completed`` with its result, never ``interrupted``, and the model sees the charge."""
    charges.clear()
    gate = Gate()

    @turnkit.tool(timeout=3)
    async def charge_card(amount: int) -> dict[str, Any]:
        """Charge the card (at most once: the default recovery)."""
        gate.runs += 1
        gate.entered.set()
        await gate.opened.wait()
        charges.append(amount)
        return {"charged": amount}

    charging_model = ChargingModel()
    charging = await outage_tk.conversation(
        turnkit.Agent("charging", model="scripted", tools=[charge_card], client=charging_model)
    )
    charge = await charging.ask("charge me", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    await asyncio.to_thread(cluster.stop)
    gate.opened.set()  # the body ends at once; its commit meets the outage
    await asyncio.sleep(6)  # the outage itself, twice the tool's timeout: its length is the fault being tested
    await asyncio.to_thread(cluster.start)

    charged = await charge.result(timeout=120)
    assert charged.status == "completed", charged.error
    [execution] = await charged.tool_executions()
    assert execution.status == "completed" and execution.result == {"charged": 5}
    assert charges == [5] and gate.runs == 1
    assert len(charging_model.requests) == 2 and charged.output_text == "charged once"


async def test_a_tool_body_past_its_own_timeout_is_interrupted(tk: TurnKit) -> None:
    """The other side of the store window: the tool's own timeout still bounds its body. An at-most-once body that
    outlasts it is settled ``interrupted`` (its outcome is unknown), is never run again, and the turn goes on."""
    gate = Gate()

    @turnkit.tool(timeout=1)
    async def bounded() -> dict[str, Any]:
        """Never finishes in time."""
        gate.runs += 1
        await gate.opened.wait()
        return {"done": True}

    client = ScriptedClient([call_tools(("bounded", {})), "gave up"])
    conversation = await tk.conversation(turnkit.Agent("bounded", model="scripted", tools=[bounded], client=client))
    turn = await conversation.ask("go")
    gate.opened.set()
    [execution] = await turn.tool_executions()
    assert turn.status == "completed" and turn.output_text == "gave up"
    assert execution.status == "interrupted" and gate.runs == 1


class OutagePainter:
    """Paints one image, and takes the database down just before it returns: the answer is paid for, and the commit
    that keeps it meets the outage."""

    def __init__(self, cluster: PrivateCluster) -> None:
        self.cluster = cluster
        self.paints = 0
        self.down = asyncio.Event()

    async def chat(self, request: ModelRequest) -> Result:
        return Result.build(text="never asked")

    async def paint(self, request: Any) -> Result:
        self.paints += 1
        if self.paints == 1:
            await asyncio.to_thread(self.cluster.stop)
            self.down.set()
        answer = image(b"\x89PNG\r\n\x1a\n" + b"outage label")
        return answer.model_copy(update={"usage": turnkit.Usage(input_tokens=1, cost=0.25)})


async def test_a_paint_whose_commit_meets_an_outage_is_kept_not_painted_again(
    outage_tk: TurnKit, cluster: PrivateCluster
) -> None:
    """Issue 36 item 1 (every paid call once): a standalone paint's provider answers, then PostgreSQL goes down before
    the image is committed. The commit waits out the outage inside the attempt: the turn completes with that image,
    the provider painted once, and the turn is charged once."""
    painter = OutagePainter(cluster)
    labels = await outage_tk.conversation(turnkit.Agent("labeller", model="scripted", client=painter))
    label = await labels.build_turn("paint a label")
    painting = asyncio.create_task(label.paint("a label", model="image-model"))
    await asyncio.wait_for(painter.down.wait(), 60)
    await asyncio.sleep(4)  # the outage itself: its length is the fault being tested
    await asyncio.to_thread(cluster.start)

    painted = await asyncio.wait_for(painting, 120)
    assert painted.status == "completed", painted.error
    assert painter.paints == 1
    assert painted.cost.total == pytest.approx(0.25)
    [message] = [m for m in await outage_tk.store.list_messages(labels.id) if m.kind == "image"]
    assert painted.output_data == {
        "type": "image",
        "images": [{k: v for k, v in message.content[0].items() if k not in ("type", "cost")}],
    }
