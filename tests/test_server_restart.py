"""A Temporal server restart while callers wait (issue 8 item 6): waiting survives it, and what reaches the caller is
a TurnKit error, never a raw ``RPCError``.

Real faults: a private dev server on a database file, killed and started again on the same port (it keeps every
workflow), with the in-process worker and the caller's client reconnecting by themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client

import turnkit
from tests.engine import Gate, gated_tool
from tests.faults import DevServer, dev_server
from turnkit import handles
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools

#: How long the server stays down: longer than the Temporal client's own retries of a call (~10 s), so that a caller
#: that does not wait it out sees the failure (a fault duration, not a settling sleep).
OUTAGE = 15.0
#: Down while a turn's end signals its waiter: past the client's own retries (~10 s), within ``WAKE_WINDOW``.
WAKE_OUTAGE = 14.0


@contextlib.asynccontextmanager
async def connected(server: DevServer, database_url: str) -> AsyncIterator[TurnKit]:
    store = await Store.open(database_url)
    try:
        client = await Client.connect(server.address, plugins=[TurnKitPlugin(store)])
        yield TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
    finally:
        await store.close()


def gated_agent(gate: Gate) -> turnkit.Agent:
    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        last = request.messages[-1]
        if last["role"] == "tool":
            return turnkit.Result.build(text="after the restart")
        return call_tools(("slow", {})) if last["content"] == "go" else turnkit.Result.build(text="ok")

    client = ScriptedClient(script)
    return turnkit.Agent("patient", model="scripted", tools=[gated_tool(gate)], client=client)


async def test_ask_waits_through_a_server_restart(database_url: str) -> None:
    """Issue 8 item 6: the server is down for ``OUTAGE`` seconds, then restarts, while ``ask()`` waits for a turn busy
    in a tool; the worker and the caller reconnect, the turn completes and ``ask()`` returns it; a later ask works."""
    gate = Gate()
    async with dev_server() as server, connected(server, database_url) as tk, tk.worker():
        conversation = await tk.conversation(gated_agent(gate))
        asking = asyncio.create_task(conversation.ask("go"))
        try:
            await asyncio.wait_for(gate.entered.wait(), 30)
            server.stop()
            await asyncio.sleep(OUTAGE)
            assert not asking.done(), asking
            await server.start()
            gate.opened.set()
            done = await asyncio.wait_for(asking, 120)
        finally:
            gate.opened.set()
        assert done.status == "completed" and done.output_text == "after the restart"
        again = await conversation.ask("once more")
        assert again.status == "completed"


async def test_errors_while_the_server_is_away_are_turnkit_errors(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 item 6: with the server down, ``ask()`` retries its idempotent submission for a bounded time, then
    raises a TurnKit error; ``Turn.result(timeout=)`` keeps waiting until its timeout; ``post`` keeps its delivery
    and says that its signal failed, as a TurnKit error."""
    monkeypatch.setattr(handles, "SUBMIT_RECONNECT_WINDOW", 2.0)
    gate = Gate()
    async with dev_server() as server, connected(server, database_url) as tk:
        conversation = await tk.conversation(gated_agent(gate))
        async with tk.worker():
            turn = await conversation.ask("go", wait=False)
            await asyncio.wait_for(gate.entered.wait(), 30)
            server.stop()
            try:
                with pytest.raises(turnkit.Error, match="submitting the turn"):
                    await conversation.ask("while away")
                with pytest.raises(TimeoutError):
                    await turn.result(timeout=1)
                with pytest.raises(turnkit.Error, match="stored delivery"):
                    await conversation.post("noted while away", key=f"away-{conversation.id}")
                assert [d.key for d in await conversation.inbox()] == [f"away-{conversation.id}"]  # kept for later
            finally:
                gate.opened.set()
                await server.start()


async def test_a_turns_end_wakes_the_lane_that_follows_it_through_a_server_restart(database_url: str) -> None:
    """Issue 9 (found by the chaos suite, 1 seed in 90): the server goes down just as a turn's end signals the lane
    that follows it (a turn is queued behind it), for longer than the client's own retries; the signal is repeated
    until the server is back, so the queued turn starts then, not after the lane's one-minute look at the store
    (``FOLLOW_POLL``)."""
    gate = Gate()
    restarted: list[asyncio.Task[None]] = []
    async with dev_server() as server, connected(server, database_url) as tk, tk.worker():

        async def restart() -> None:
            server.stop()
            await asyncio.sleep(WAKE_OUTAGE)  # the fault's duration
            await server.start()

        def script(request: turnkit.ModelRequest) -> turnkit.Result:
            last = request.messages[-1]
            if last["role"] == "tool":  # the busy turn's last model call: its end meets the server away
                restarted.append(asyncio.get_running_loop().create_task(restart()))
                return turnkit.Result.build(text="ended")
            return call_tools(("slow", {})) if last["content"] == "busy" else turnkit.Result.build(text="next")

        agent = turnkit.Agent("follows", model="scripted", tools=[gated_tool(gate)], client=ScriptedClient(script))
        conversation = await tk.conversation(agent)
        busy = await conversation.ask("busy", wait=False)
        await asyncio.wait_for(gate.entered.wait(), 30)
        queued = await conversation.ask("after", wait=False)  # the lane follows the busy turn: a wait row
        gate.opened.set()
        done = await queued.result(timeout=50)  # under FOLLOW_POLL after the outage: the end's signal got through
        assert done.output_text == "next" and (await busy.refresh()).output_text == "ended"
        assert restarted and restarted[0].done()
