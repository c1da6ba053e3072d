"""Hostile input and values the store cannot hold, on a real dev server and real databases (issue 8 items 1, 11, 12,
13). Each test is the observed fault of the issue, reproduced: it must end in a clear error or a stored, working
turn, and the conversation must keep working afterwards.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

import turnkit
from tests.engine import eventually, held_tool
from tests.faults import private_cluster
from turnkit import handles
from turnkit._engine.ids import new_id
from turnkit._workflows.lane import SUBMIT_TIMEOUT
from turnkit.config import configure
from turnkit.kernel.errors import InputError, RecordNotFound, StoreError
from turnkit.kernel.payloads import SubmitTurn
from turnkit.model import Result, ToolCall
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools

RUNS: dict[str, int] = {}
LOOP: dict[str, Any] = {}
LOOP["self"] = LOOP


@turnkit.tool(recovery="replay_safe")
def echo(text: str) -> dict[str, Any]:
    """Echo the text and its length.

    Args:
        text: Anything.
    """
    return {"text": text, "length": len(text)}


@turnkit.tool(recovery="replay_safe")
def measure() -> dict[str, Any]:
    """Return numbers JSON cannot hold."""
    return {"nan": math.nan, "inf": math.inf, "ok": 1.5}


@turnkit.tool(recovery="replay_safe")
def nul_text() -> dict[str, Any]:
    """Return a string with a NUL."""
    return {"s": "a\x00b", "k\x00": 1}


@turnkit.tool
def charge_loop() -> dict[str, Any]:
    """At most once: a real effect, then a circular result."""
    RUNS["charge_loop"] = RUNS.get("charge_loop", 0) + 1
    return LOOP


@turnkit.tool(recovery="replay_safe", max_attempts=5)
def fetch_loop() -> dict[str, Any]:
    """Replay-safe: a circular result (re-running cannot help)."""
    RUNS["fetch_loop"] = RUNS.get("fetch_loop", 0) + 1
    return LOOP


def _agent(client: ScriptedClient, *tools: Any) -> turnkit.Agent:
    return turnkit.Agent(f"hostile-{uuid.uuid4().hex[:8]}", model="scripted", client=client, tools=list(tools))


async def test_nul_or_long_model_ask_is_refused_and_the_conversation_keeps_working(tk: TurnKit) -> None:
    """Issue 8 item 1: a NUL ask and a 256-character model give InputError; the next ask completes at once."""
    client = ScriptedClient(["still here", "and again"])
    conversation = await tk.conversation(_agent(client))
    with pytest.raises(InputError, match="text must not contain NUL"):
        await conversation.ask("hello \x00 world")
    with pytest.raises(InputError, match="model is too long"):
        await conversation.ask("hello", model="m" * 256)
    turn = await conversation.ask("hello", wait=False)
    await turn.result(timeout=30)
    assert turn.status == "completed" and turn.output_text == "still here"
    assert (await conversation.ask("again")).output_text == "and again"
    assert [m.text for m in await conversation.messages() if m.role == "user"] == ["hello", "again"]


async def test_a_submit_the_store_rejects_fails_once_and_frees_the_lane(tk: TurnKit) -> None:
    """Issue 8 item 1: a submission the database rejects (bypassing the API checks) is not retried forever while the
    lane holds its write lock: the update is rejected with StoreError at once, nothing is written, the lane works."""
    if tk.store.dialect != "postgresql":
        pytest.skip("SQLite stores a 300-character model; PostgreSQL rejects it (the API refuses it on both)")
    client = ScriptedClient(["fine"])
    conversation = await tk.conversation(_agent(client))
    bad = SubmitTurn(
        conversation_id=conversation.id,
        turn_id=new_id("turn"),
        message_id=new_id("message"),
        text="hello",
        model="m" * 300,
    )
    started = time.monotonic()
    with pytest.raises(StoreError, match=r"a string is longer than its column \(SQLSTATE 22001\)") as caught:
        await conversation._submit(bad)  # pyright: ignore[reportPrivateUsage]
    assert time.monotonic() - started < 10, "the submission was retried"
    assert "INSERT" not in str(caught.value) and "m" * 300 not in str(caught.value)
    assert await conversation.messages() == [] and await conversation.turns() == []
    turn = await conversation.ask("hello")
    assert turn.status == "completed" and turn.output_text == "fine"


async def test_model_output_with_nul_is_stored_not_retried(tk: TurnKit) -> None:
    """Issue 8 item 1: a NUL in the model's text and in its tool arguments is made storable (U+FFFD): the turn
    completes with one model call per step, no paid retries and no raw DBAPIError."""
    client = ScriptedClient([call_tools(("echo", {"text": "a\x00b"}), text="calling\x00"), "done \x00 here"])
    conversation = await tk.conversation(_agent(client, echo))
    turn = await conversation.ask("go")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "done \ufffd here"
    assert client.calls == 2
    [execution] = await turn.tool_executions()
    assert execution.arguments == {"text": "a\ufffdb"}
    assert execution.result == {"text": "a\ufffdb", "length": 3}


async def test_over_long_tool_call_ids_and_names_from_the_model_fit_their_columns(tk: TurnKit) -> None:
    """Issue 8 item 1: a 300-character tool-call id and tool name (String(255) columns) do not fail the writes on
    PostgreSQL: they are cut to 255 characters on both databases, the unknown tool fails, and the turn goes on."""
    call = ToolCall(id="c" * 300, name="n" * 300, arguments={})
    client = ScriptedClient([Result.build(tool_calls=[call]), "carried on"])
    conversation = await tk.conversation(_agent(client, echo))
    turn = await conversation.ask("go")
    assert turn.status == "completed" and turn.output_text == "carried on", turn.error
    [execution] = await turn.tool_executions()
    assert (execution.tool_call_id, execution.tool_name, execution.status) == ("c" * 255, "n" * 255, "failed")
    assert client.calls == 2


async def test_tool_results_the_store_cannot_hold(tk: TurnKit) -> None:
    """Issue 8 item 11: NaN becomes null, NUL becomes U+FFFD (same on both databases); a circular result completes
    the call with a message saying the tool ran, and neither an at-most-once nor a replay-safe tool runs again."""
    RUNS.clear()
    client = ScriptedClient(
        [call_tools(("measure", {}), ("nul_text", {}), ("charge_loop", {}), ("fetch_loop", {})), "done"]
    )
    conversation = await tk.conversation(_agent(client, measure, nul_text, charge_loop, fetch_loop))
    turn = await conversation.ask("go")
    assert turn.status == "completed", turn.error
    executions = {e.tool_name: e for e in await turn.tool_executions()}
    assert {name: e.status for name, e in executions.items()} == dict.fromkeys(executions, "completed")
    assert executions["measure"].result == {"nan": None, "inf": None, "ok": 1.5}
    assert executions["nul_text"].result == {"s": "a\ufffdb", "k\ufffd": 1}
    for name in ("charge_loop", "fetch_loop"):
        result = executions[name].result or {}
        assert result == {
            "result_unstorable": "the tool ran, but the tool result cannot be stored: it is circular "
            "(it contains itself)"
        }, result
        assert RUNS[name] == 1, f"{name} ran {RUNS[name]} times"
    assert client.calls == 2


async def test_a_3_mb_ask_is_refused_at_once_and_other_asks_go_on(tk: TurnKit) -> None:
    """Issue 8 item 12: a 3 MB ask is an InputError before anything is sent; the next ask completes at once."""
    client = ScriptedClient(["small is fine"])
    conversation = await tk.conversation(_agent(client))
    started = time.monotonic()
    with pytest.raises(InputError, match=r"text is too large: 3145728 bytes \(the limit is 262144 bytes"):
        await conversation.ask("x" * (3 * 1024 * 1024))
    assert time.monotonic() - started < 1
    turn = await conversation.ask("small")
    assert turn.status == "completed" and turn.output_text == "small is fine"


async def test_3_mb_of_tool_arguments_from_the_model_travel_by_id(tk: TurnKit) -> None:
    """Issue 8 item 12: 3 MB of tool arguments from the model do not cross a Temporal payload (PayloadsTooLarge):
    the workflow gets the call without them and the tool activity reads them from the stored assistant message."""
    configure(compaction=False)  # a 3 MB history would be compacted first, by the same scripted client
    big = "y" * (3 * 1024 * 1024)
    client = ScriptedClient([call_tools(("echo", {"text": big})), "measured"])
    conversation = await tk.conversation(_agent(client, echo))
    turn = await conversation.ask("measure this")
    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "completed"
    assert execution.arguments == {"text": big}
    assert (execution.result or {})["length"] == len(big)
    assert client.calls == 2


async def test_a_200_kib_ask_travels_by_id_and_its_content_stays_out_of_the_lane_history(tk: TurnKit) -> None:
    """Issue 8 item 12: the text, context, principal and metadata of a 200 KiB ask are staged in the store and the
    lane's submit update carries only their id: the turn completes with all of them, none is in the lane's history,
    and the staged row is gone; an old-style inline submission still works (and is found in the history)."""
    marker = f"marker-{uuid.uuid4().hex}"
    text = marker + "-text " + "z" * (200 * 1024)
    client = ScriptedClient(["read it", "inline too"])
    conversation = await tk.conversation(_agent(client))
    turn = await conversation.ask(
        text,
        context={"note": f"{marker}-context"},
        principal={"user": f"{marker}-principal"},
        metadata={"tag": f"{marker}-metadata"},
    )
    assert turn.status == "completed" and turn.output_text == "read it"
    [message] = [m for m in await conversation.messages() if m.role == "user"]
    assert message.text == text and message.metadata == {"tag": f"{marker}-metadata"}
    assert turn.record.options.context == {"note": f"{marker}-context"}
    assert turn.record.options.principal == {"user": f"{marker}-principal"}
    async with tk.store.atomic() as tx:
        with pytest.raises(RecordNotFound, match="staged input not found"):
            await tx.load_staged_input(message.id)

    # A submission with inline content (an older client's) is still accepted as before.
    inline = f"inline-{uuid.uuid4().hex}"
    request = SubmitTurn(
        conversation_id=conversation.id, turn_id=new_id("turn"), message_id=new_id("message"), text=inline
    )
    await conversation._submit(request)  # pyright: ignore[reportPrivateUsage]
    old = tk.turn(request.turn_id)
    await old.result(timeout=30)
    assert old.status == "completed" and old.output_text == "inline too"

    # Payload data is raw JSON bytes in the serialised history: the inline text is there, the staged content not.
    history = await tk.client.get_workflow_handle(conversation.id).fetch_history()
    raw = b"".join(event.SerializeToString() for event in history.events)
    assert inline.encode() in raw  # the search finds what did cross a payload
    assert marker.encode() not in raw
    assert len(raw) < 64 * 1024, len(raw)


async def test_result_timeout_bounds_a_running_turn(tk: TurnKit) -> None:
    """Issue 8 item 13: ``Turn.result(timeout=)`` gives up after its timeout while the turn runs, too."""
    release, hold = held_tool()
    client = ScriptedClient([call_tools(("hold", {})), "released"])
    conversation = await tk.conversation(_agent(client, hold))
    turn = await conversation.ask("wait", wait=False)

    async def running() -> bool:
        return (await turn.refresh()).status == "running" and bool(await turn.tool_executions())

    await eventually(running, what="the turn running its held tool")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.5 s"):
        await turn.result(timeout=0.5)
    assert time.monotonic() - started < 3
    release.set()
    await asyncio.wait_for(turn.result(), 30)
    assert turn.status == "completed" and turn.output_text == "released"
    assert (await tk.turn(turn.id).result(timeout=0)).status == "completed"  # a finished turn needs no time


@pytest.mark.slow
async def test_a_submit_during_a_store_outage_is_bounded_and_frees_the_lane(
    temporal: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 8 item 1: with PostgreSQL stopped (a private cluster), a submission retries only for SUBMIT_TIMEOUT, then
    the update is rejected with StoreError and the lane's write lock is free: after the restart the next ask completes,
    and the rejected submission wrote nothing."""
    try:
        cluster_context = private_cluster()
        cluster = cluster_context.__enter__()
    except RuntimeError as err:
        pytest.skip(str(err))
    try:
        store = await Store.open(cluster.url())
        address = temporal.client.service_client.config.target_host
        client = await Client.connect(address, plugins=[TurnKitPlugin(store)])
        tk = TurnKit(client, store, task_queue=f"tq-{uuid.uuid4().hex[:12]}")
        try:
            async with tk.worker():
                conversation = await tk.conversation(_agent(ScriptedClient(["before", "after"])))
                assert (await conversation.ask("first")).output_text == "before"
                cluster.stop()
                started = time.monotonic()
                # The ask stages its input first (issue 8 item 12): it waits out a blink for STAGE_RETRY_WINDOW
                # (shortened here), then fails, and nothing reaches the lane.
                monkeypatch.setattr(handles, "STAGE_RETRY_WINDOW", 2.0)
                with pytest.raises(StoreError, match="the store did not accept the turn's input: the store is una"):
                    await conversation.ask("during the outage", wait=False)
                assert 1.0 <= time.monotonic() - started < 15
                # A submission already in flight when the store went away (content inline) is bounded by the lane.
                request = SubmitTurn(
                    conversation_id=conversation.id,
                    turn_id=new_id("turn"),
                    message_id=new_id("message"),
                    text="during the outage",
                )
                started = time.monotonic()
                with pytest.raises(StoreError, match="the store did not accept the turn within 60 s"):
                    await conversation._submit(request)  # pyright: ignore[reportPrivateUsage]
                waited = time.monotonic() - started
                # The last retry that fits the bound ends it: up to one backoff interval (10 s) before the bound.
                assert SUBMIT_TIMEOUT.total_seconds() - 15 <= waited < SUBMIT_TIMEOUT.total_seconds() + 15, waited
                cluster.start()
                turn = await conversation.ask("second", wait=False)
                await turn.result(timeout=60)
                assert turn.status == "completed" and turn.output_text == "after"
                texts = [m.text for m in await conversation.messages() if m.role == "user"]
                assert texts == ["first", "second"]
        finally:
            await store.close()
    finally:
        cluster_context.__exit__(None, None, None)
