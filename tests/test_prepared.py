"""Prepared turns and preview (behaviour §1.4, §1.5, §5.2; T04, T05, T40, T62) on a real dev server.

A prepared turn is built (``Conversation.build_turn``, ``run(prepare=True)``) but not submitted: ``pending`` with no
``submitted_at``, no workflow, no model call. ``preview`` shows the request its model call will send (built by the
model activity's own function), and ``perform_later`` / ``run`` submit it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

import turnkit
from tests.engine import held_tool, stored_pending_turn
from turnkit.kernel.errors import AuthorizationError, Error, InputError
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


async def no_workflow(tk: TurnKit, workflow_id: str) -> bool:
    """Whether Temporal has no workflow with this id (nothing was started or queued for it)."""
    try:
        await tk.client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return True
        raise
    return False


async def test_prepared_run_is_pending_until_run(tk: TurnKit) -> None:
    """T04: ``run(..., prepare=True)`` is pending, with no model call, no workflow (not even its conversation's
    lane), no ``submitted_at`` and no finding from ``check``; ``run()`` submits it and it completes."""
    since = utcnow()
    client = ScriptedClient(["done"])
    agent = turnkit.Agent("worker", model="scripted", client=client)
    run = await tk.run(agent, "x", prepare=True)

    assert run.status == "pending" and run.is_pending and not run.is_background
    assert run.record.submitted_at is None and client.calls == 0
    assert await no_workflow(tk, run.id) and await no_workflow(tk, run.record.conversation_id)
    assert run.id not in [t.id for t in await tk.store.list_submitted_turns()]
    assert [f for f in await tk.check(since=since, grace=0) if run.id in f.ids] == []
    reconciled = await tk.reconcile(since=since, grace=0)  # maintenance neither submits nor fails a prepared run
    assert [r for r in reconciled.repairs if run.id in r.ids] == []
    assert (await run.refresh()).is_pending and run.record.submitted_at is None and client.calls == 0
    # Prepared runs take their callback at submission.
    with pytest.raises(InputError, match="perform_later"):
        await tk.run(agent, "y", prepare=True, callback=run.record.conversation_id)

    finished = await run.run()
    assert finished is run and run.status == "completed" and run.is_completed and run.output_text == "done"
    assert run.is_background and client.calls == 1
    assert [m["content"] for m in client.requests[0].messages] == ["x"]
    assert run.id in [t.id for t in await tk.store.list_submitted_turns()]
    # Submitting a finished turn is refused.
    with pytest.raises(Error, match="only pending or paused turns can be submitted"):
        await run.perform_later()


async def test_preview_is_the_request_the_model_gets(tk: TurnKit) -> None:
    """T05: ``preview`` of a pending turn returns the model, tool names, instructions and messages, with
    ``report["chars"] > 0``, and never calls the model; the request the model later receives is the same one
    (only the environment's clock anchor and the reserved request id differ)."""
    client = ScriptedClient(["answer"])
    agent = turnkit.Agent("clerk", model="scripted", instructions="Be exact.", tools=[lookup], client=client)
    conversation = await tk.conversation(agent, context={"tenant": "acme"})
    await conversation.say("earlier note")
    turn = await conversation.build_turn("what is the lamp count?", context={"tenant": "globex"})
    later = await conversation.say("written after the turn was built")  # outside its frozen context

    preview = await turn.preview()
    assert client.calls == 0 and (await turn.refresh()).is_pending
    assert preview.model == "scripted" and preview.tool_names == ["lookup"]
    assert "<instructions>\nBe exact.\n</instructions>" in preview.instructions
    assert preview.dynamic_instructions is not None and "globex" in preview.dynamic_instructions
    assert [m["content"] for m in preview.messages] == ["earlier note", "what is the lamp count?"]
    assert preview.report["chars"] > 0 and preview.report["tool_count"] == 1
    assert preview.metadata == {"turn_id": turn.id, "conversation_id": conversation.id, "request_id": None}

    await turn.run()
    assert turn.status == "completed" and client.calls == 1
    [sent] = client.requests
    assert later.text not in [m["content"] for m in sent.messages]
    assert (sent.model, sent.messages, sent.tools, sent.instructions) == (
        preview.model,
        preview.messages,
        preview.tools,
        preview.instructions,
    )
    assert (sent.thinking, sent.output_schema) == (preview.thinking, preview.output_schema)
    assert sent.dynamic_instructions and preview.dynamic_instructions
    before_environment = preview.dynamic_instructions.split("<environment>")[0]
    assert sent.dynamic_instructions.split("<environment>")[0] == before_environment
    assert sent.report["sections"] == preview.report["sections"] and sent.metadata["request_id"]


async def test_paused_prepared_turn_with_a_callback(tk: TurnKit) -> None:
    """A prepared paused turn is an approval gate: submitted, it stays paused (nothing runs); resumed, it completes
    and its callback conversation receives the result."""
    client = ScriptedClient(["approved"])
    agent = turnkit.Agent("gate", model="scripted", client=client)
    conversation = await tk.conversation(agent)
    inbox = await tk.conversation(turnkit.Agent("inbox", model="scripted", client=ScriptedClient([])))
    turn = await conversation.build_turn("ship it?", paused=True)
    assert turn.is_paused and not turn.is_background

    await turn.perform_later(callback=inbox)
    assert turn.is_paused and turn.is_background
    assert turn.record.options.callback_conversation_id == inbox.id
    await turn.resume()
    await turn.result()
    assert turn.is_completed and turn.output_text == "approved" and client.calls == 1
    assert [d.key for d in await inbox.inbox()] == [f"completion:{turn.id}"]


async def test_prepared_run_waits_then_is_submitted(tk: TurnKit) -> None:
    """T62: ``run(prepare=True).wait_for(child).perform_later()``: the run is ``waiting`` at submission (its target
    is unfinished); once the target ends, the run's first model request carries the ``wait_results`` message."""
    release, hold = held_tool()
    target_agent = turnkit.Agent(
        "target", model="scripted", tools=[hold], client=ScriptedClient([call_tools(("hold", {})), "child out"])
    )
    child = await (await tk.conversation(target_agent)).ask("work", wait=False)
    client = ScriptedClient(["joined"])
    parent = await tk.run(turnkit.Agent("parent", model="scripted", client=client), "merge", prepare=True)
    await parent.wait_for(child)
    await parent.perform_later()
    assert parent.is_waiting and parent.is_background and client.calls == 0

    release.set()
    await parent.result(timeout=60)
    assert parent.is_completed and parent.output_text == "joined" and client.calls == 1
    last = client.requests[0].messages[-1]
    assert last["role"] == "user" and json.loads(last["content"])["wait_results"][0]["result"] == "child out"


async def test_wait_for_asks_the_hook_for_the_turns_own_principal(tk: TurnKit) -> None:
    """``Turn.wait_for`` asks ``wait`` for the principal the turn was asked with, not for whoever calls it: a policy
    that lets only alice's turns wait accepts alice's prepared turn (the caller names no principal) and refuses
    mallory's, which then has no wait edge."""
    asked: list[Any] = []

    def policy(action: str, *, principal: Any, **resources: Any) -> bool:
        if action == "wait":
            asked.append(principal)
            return principal == "alice"
        return True

    agent = turnkit.Agent("waiter", model="scripted", client=ScriptedClient(["joined"]))
    target = await (await tk.conversation(turnkit.Agent("target", model="scripted", client=ScriptedClient(["t"])))).ask(
        "t"
    )
    turnkit.configure(authorize=policy)
    alices = await tk.run(agent, "merge", prepare=True, principal="alice")
    await alices.wait_for(target)
    mallorys = await tk.run(agent, "merge", prepare=True, principal="mallory")
    with pytest.raises(AuthorizationError, match="not authorized to wait"):
        await mallorys.wait_for(target)
    assert asked == ["alice", "mallory"]
    async with tk.store.atomic() as tx:
        assert [w.target_turn_id for w in await tx.list_waits(turn_id=alices.id)] == [target.id]
        assert await tx.list_waits(turn_id=mallorys.id) == []


async def test_reconcile_runs_lost_submitted_work_and_leaves_previews(tk: TurnKit) -> None:
    """T40: a prepared (preview) run and a submitted run whose submission never reached its lane (written to the
    store only, as if the enqueue failed); ``reconcile`` queues the submitted run, which completes with one model
    call, and the preview stays ``pending`` with no ``submitted_at``. Scoped to what this test made (``since``):
    turns other tests left behind are not this test's to repair."""
    since = utcnow()
    client = ScriptedClient(["recovered"])
    agent = turnkit.Agent("lost", model="scripted", client=client)
    preview_run = await tk.run(agent, "only a preview", prepare=True)
    conversation = await tk.conversation(agent)
    lost = await stored_pending_turn(tk, conversation.id, agent, "submitted, never enqueued")

    reconciled = await tk.reconcile(since=since, grace=0)
    assert [(r.action, r.ids[0]) for r in reconciled.repairs] == [("requeued", lost.id)]
    done = await tk.turn(lost.id).result(timeout=60)
    assert done.status == "completed" and done.output_text == "recovered" and client.calls == 1
    assert [m["content"] for m in client.requests[0].messages] == ["submitted, never enqueued"]
    await preview_run.refresh()
    assert preview_run.is_pending and preview_run.record.submitted_at is None
    assert await no_workflow(tk, preview_run.id)
