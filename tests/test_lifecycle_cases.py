"""Behaviour §10 lifecycle cases on a real Temporal dev server: events (T12), a crashing event observer (T72),
cascade cancel of a middle child (T80), cancel with input pending (T81) and late writes after cancel (T82, T103).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import turnkit
from tests.engine import Gate, HeldModel, eventually, gated_tool, lane_buffers
from turnkit._activities.tools import ToolActivities
from turnkit._activities.turns import TurnActivities
from turnkit.kernel.payloads import SettleToolCall, ToolCallRef, ToolOutcome
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools, say

TERMINAL = ("completed", "failed", "cancelled")
CANCELLED = {"class": "TurnKit::Cancelled", "message": "cancelled by application"}


def calls_then_answers(*calls: tuple[str, dict[str, Any]], answer: str) -> ScriptedClient:
    """A client that proposes ``calls`` on the task message and answers ``answer`` once it has tool results."""

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        if request.messages[-1]["role"] == "user":
            return call_tools(*calls)
        return turnkit.Result.build(text=answer)

    return ScriptedClient(script)


def observe_late_completions(monkeypatch: pytest.MonkeyPatch) -> tuple[list[ToolOutcome], asyncio.Event]:
    """Record what each tool activity's commit step (``ToolActivities._complete``) returned.

    A late completion writes nothing when it is right, so there is no record to wait for: this hook tells the test
    when the attempt to commit a tool's result has finished, and with which outcome.
    """
    outcomes: list[ToolOutcome] = []
    done = asyncio.Event()
    original = ToolActivities._complete  # pyright: ignore[reportPrivateUsage]

    async def observed(self: ToolActivities, *args: Any, **kwargs: Any) -> ToolOutcome:
        try:
            outcome = await original(self, *args, **kwargs)
            outcomes.append(outcome)
            return outcome
        finally:
            done.set()

    monkeypatch.setattr(ToolActivities, "_complete", observed)
    return outcomes, done


async def test_plain_turn_emits_lifecycle_events_with_the_turn_id(tk: TurnKit) -> None:
    """T12: a plain turn emits ``turn.started``, ``model.requested`` (message_count 1, prompt chars > 0),
    ``model.completed`` (usage total_tokens 0) and ``turn.completed`` with their §3.11 payload keys, all with the
    turn's id."""
    events: list[turnkit.Event] = []
    turnkit.configure(on_event=events.append)
    client = ScriptedClient([say("hello", usage=turnkit.Usage())])  # zero usage, as TurnKit's FakeClient
    conversation = await tk.conversation(turnkit.Agent("plain", model="scripted", client=client))
    turn = await conversation.ask("Hi")
    assert turn.status == "completed" and turn.output_text == "hello"

    mine = [e for e in events if e.conversation_id == conversation.id]
    assert mine, "no event reached turnkit.configure(on_event=...)"
    assert {e.turn_id for e in mine} == {turn.id}, "every event must carry the turn's id"
    by_type: dict[str, turnkit.Event] = {}
    for event in mine:
        by_type.setdefault(event.type, event)

    # Behaviour §3.11 payloads for T12's four events; collect every difference so one run reports them all.
    required = {
        "turn.started": {"status", "model"},
        "model.requested": {"model", "tool_names", "message_count", "prompt"},
        "model.completed": {"model", "tool_call_count", "usage", "cost"},
        "turn.completed": {"status", "output_text"},
    }
    problems: list[str] = []
    for type_, keys in required.items():
        event = by_type.get(type_)
        if event is None:
            problems.append(f"{type_} not emitted")
            continue
        missing = keys - set(event.payload)
        if missing:
            problems.append(f"{type_} payload lacks {sorted(missing)} (has {sorted(event.payload)})")
    requested = by_type.get("model.requested")
    if requested is not None:
        if requested.payload.get("message_count") != 1:
            problems.append(f"model.requested message_count is {requested.payload.get('message_count')!r}, not 1")
        prompt = requested.payload.get("prompt")
        if not (isinstance(prompt, dict) and int(prompt.get("chars") or 0) > 0):  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
            problems.append(f"model.requested prompt report has no chars > 0: {prompt!r}")
    completed_model = by_type.get("model.completed")
    if completed_model is not None and (completed_model.payload.get("usage") or {}).get("total_tokens") != 0:
        problems.append(f"model.completed usage is {completed_model.payload.get('usage')!r}, total_tokens not 0")
    completed_turn = by_type.get("turn.completed")
    if completed_turn is not None and (
        completed_turn.payload.get("status"),
        completed_turn.payload.get("output_text"),
    ) != ("completed", "hello"):
        problems.append(f"turn.completed payload is {completed_turn.payload!r}")
    emitted = [e.type for e in mine]
    assert not problems, "behaviour §3.11/T12 events differ:\n  " + "\n  ".join(problems) + f"\nemitted: {emitted}"


async def test_a_raising_turn_completed_observer_keeps_the_turn_and_its_callback(tk: TurnKit) -> None:
    """T72: a ``turn.completed`` observer that raises leaves the run ``completed`` with its callback delivery
    committed; after reconcile the destination inbox holds that 1 delivery, its message JSON with the run's
    ``turn_id``."""
    since = utcnow()
    job_client = ScriptedClient(["job done"])
    job = await tk.conversation(turnkit.Agent("job", model="scripted", client=job_client))
    boss_client = ScriptedClient(lambda request: turnkit.Result.build(text="noted"))
    boss = await tk.conversation(turnkit.Agent("boss", model="scripted", client=boss_client))
    raised: list[str] = []

    def observer(event: turnkit.Event) -> None:
        if event.type == "turn.completed" and event.conversation_id == job.id:
            raised.append(event.turn_id)
            raise OSError("observer crashed")

    turnkit.configure(on_event=observer)
    turn = await job.ask("do the job", callback=boss, wait=False)
    done = await turn.result(timeout=60)

    assert done.status == "completed" and done.output_text == "job done"
    assert raised == [turn.id], "the observer must have seen (and raised on) the turn's completion"
    assert job_client.calls == 1  # the committed answer was reused, never re-requested
    [delivery] = await job.outbox()  # committed with the terminal write, despite the crash after it
    assert delivery.key == f"completion:{turn.id}" and delivery.destination_conversation_id == boss.id
    assert delivery.source_turn_id == turn.id

    await tk.reconcile(since=since)

    async def delivered() -> bool:
        inbox = await boss.inbox()
        return len(inbox) == 1 and inbox[0].delivered_at is not None

    await eventually(delivered, what="the callback delivery to reach the destination")
    [stored] = await boss.inbox()
    assert stored.id == delivery.id
    first = (await boss.messages())[0]
    assert first.metadata["delivery_id"] == delivery.id
    assert json.loads(first.text)["turn_id"] == turn.id

    async def boss_done() -> bool:
        turns = await boss.turns()
        return len(turns) == 1 and turns[0].record.terminal

    await eventually(boss_done, what="the destination's woken turn")
    assert boss_client.calls == 1 and len(await boss.inbox()) == 1


async def test_cascade_cancel_of_a_middle_child_spares_the_root_and_the_sibling(tk: TurnKit) -> None:
    """T80: a cascade cancel of mid in root→mid→leaf plus a sibling cancels mid and leaf (interrupting leaf's tool)
    while root and the sibling keep going; root then completes, seeing mid cancelled and the sibling completed."""
    turnkit.configure(tool_heartbeat_timeout=1.0)  # cancellation reaches a running tool through its heartbeat
    leaf_gate, sibling_gate = Gate(), Gate()
    leaf = turnkit.Agent(
        "leaf",
        model="scripted",
        tools=[gated_tool(leaf_gate, "dig")],
        client=calls_then_answers(("dig", {}), answer="leaf done"),
    )
    mid_client = calls_then_answers(("leaf", {"task": "dig deeper"}), answer="mid done")
    mid = turnkit.Agent("mid", model="scripted", sub_agents=[leaf], client=mid_client)
    sibling = turnkit.Agent(
        "sibling",
        model="scripted",
        tools=[gated_tool(sibling_gate, "scan")],
        client=calls_then_answers(("scan", {}), answer="sibling done"),
    )
    root_client = ScriptedClient([call_tools(("mid", {"task": "m"}), ("sibling", {"task": "s"})), "root done"])
    root_agent = turnkit.Agent("root", model="scripted", sub_agents=[mid, sibling], client=root_client)
    root = await (await tk.conversation(root_agent)).ask("split", wait=False)
    try:
        await asyncio.wait_for(leaf_gate.entered.wait(), 30)
        await asyncio.wait_for(sibling_gate.entered.wait(), 30)
        tree = {t.agent_name: t for t in await tk.store.list_turns(root_turn_id=root.id)}
        assert set(tree) == {"root", "mid", "leaf", "sibling"}
        assert tree["mid"].parent_turn_id == root.id and tree["sibling"].parent_turn_id == root.id
        assert tree["leaf"].parent_turn_id == tree["mid"].id

        await tk.turn(tree["mid"].id).cancel(descendants="cascade")

        after = {t.agent_name: t for t in await tk.store.list_turns(root_turn_id=root.id)}
        assert after["mid"].status == "cancelled" and after["mid"].error == CANCELLED
        assert after["leaf"].status == "cancelled" and after["leaf"].error == CANCELLED
        assert after["root"].status not in TERMINAL, f"root must keep going, is {after['root'].status}"
        assert after["sibling"].status not in TERMINAL, f"sibling must keep going, is {after['sibling'].status}"
        [dig] = await tk.store.list_tool_executions(turn_id=after["leaf"].id)
        assert dig.status == "interrupted"
        [scan] = await tk.store.list_tool_executions(turn_id=after["sibling"].id)
        assert scan.status == "running"  # the sibling's tool is untouched

        sibling_gate.opened.set()
        done = await root.result(timeout=60)
        assert done.status == "completed" and done.output_text == "root done"
        final = {t.agent_name: t for t in await tk.store.list_turns(root_turn_id=root.id)}
        assert final["sibling"].status == "completed" and final["sibling"].output_text == "sibling done"
        assert final["mid"].status == "cancelled" and final["leaf"].status == "cancelled"
        results = [json.loads(m["content"]) for m in root_client.requests[1].messages if m["role"] == "tool"]
        assert [(r["turn_id"], r["status"]) for r in results] == [
            (final["mid"].id, "cancelled"),
            (final["sibling"].id, "completed"),
        ]
        assert mid_client.calls == 1 and leaf_gate.runs == 1  # nothing in the cancelled branch ran again
    finally:
        leaf_gate.opened.set()
        sibling_gate.opened.set()


async def test_cancel_during_a_model_call_with_posted_input_continues_as_the_owner(tk: TurnKit) -> None:
    """T81: cancelling a turn whose model call is held, with a post buffered in its lane, ends it ``cancelled`` with no
    output and no messages; the post's continuation turn then runs with principal "owner", not the sender's."""
    model = HeldModel(turnkit.Result.build(text="too late"), then="continued")
    conversation = await tk.conversation(turnkit.Agent("owned", model="scripted", client=model), principal="owner")
    turn = await conversation.ask("go", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)
    posted = await conversation.post("follow-up", key=f"follow-up-{conversation.id}", principal="sender")
    await eventually(lambda: lane_buffers(tk, conversation.id, posted.id), what="the lane to hold the post")

    cancelled = await turn.cancel()
    assert cancelled.status == "cancelled"
    model.released.set()
    done = await turn.result(timeout=60)
    assert done.status == "cancelled" and done.error == CANCELLED
    assert done.record.output_text is None and done.output_text == ""
    assert [m.role for m in await done.messages()] == [], "the late response must write nothing"

    async def continuation_finished() -> bool:
        turns = await conversation.turns()
        return len(turns) == 2 and turns[1].record.terminal

    await eventually(continuation_finished, what="the posted input's continuation turn")
    _, continuation = await conversation.turns()
    assert continuation.record.options.principal == "owner"  # the conversation's, never the sender's
    [message] = [m for m in await conversation.messages() if m.metadata.get("delivery_id") == posted.id]
    assert message.text == "follow-up" and message.metadata["principal"] == "sender"
    assert continuation.record.options.trigger_message_id == message.id
    assert continuation.status == "completed" and continuation.output_text == "continued"
    assert len(model.requests) == 2
    later = [m["content"] for m in model.requests[1].messages]
    assert later[-1] == "follow-up" and "too late" not in later
    assert (await conversation.input_status(posted.id))["application"]["turn_id"] == continuation.id


async def test_a_tool_writing_after_cancel_leaves_no_trace(tk: TurnKit, monkeypatch: pytest.MonkeyPatch) -> None:
    """T82: a tool that keeps running after ``cancel()`` and then calls ``context.say`` gets ``LostClaim``: the turn is
    ``cancelled``, the execution ``interrupted`` with no result, and the late message is absent."""
    turnkit.configure(tool_heartbeat_timeout=1.0)  # cancellation reaches a running tool through its heartbeat
    late_outcomes, _ = observe_late_completions(monkeypatch)
    entered, saw_cancel, release, wrote = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()
    write_errors: list[BaseException] = []
    late_text = "late message from the tool"

    async def write_note(context: turnkit.ToolContext) -> dict[str, Any]:
        """Write a note, slowly; it does not stop when asked to."""
        entered.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            saw_cancel.set()
            await release.wait()  # an uncooperative tool: it finishes its work anyway
        try:
            await context.say(late_text)  # the tool's own writes go through its context: fenced by the call
        except Exception as err:  # the fenced write refuses
            write_errors.append(err)
        finally:
            wrote.set()
        return {"wrote": True}

    client = ScriptedClient([call_tools(("write_note", {})), "never"])
    agent = turnkit.Agent("writer", model="scripted", tools=[turnkit.tool(write_note)], client=client)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("write", wait=False)
    await asyncio.wait_for(entered.wait(), 30)

    cancelled = await turn.cancel()
    assert cancelled.status == "cancelled" and cancelled.error == CANCELLED
    await asyncio.wait_for(saw_cancel.wait(), 30)  # the cancellation reached the tool body
    release.set()
    await asyncio.wait_for(wrote.wait(), 30)

    done = await turn.result(timeout=60)
    assert done.status == "cancelled"
    [execution] = await done.tool_executions()
    assert execution.status == "interrupted" and execution.result is None
    # The cancelled attempt waited for its body to unwind and then ended cancelled: it commits nothing (a late
    # completion, were one tried, would lose its CAS).
    assert all(o.status == "interrupted" for o in late_outcomes), "a late completion must lose its CAS"
    [result] = [m for m in await done.messages() if m.kind == "tool_result"]  # the one written by cancel
    assert result.tool_execution_id == execution.id and result.metadata.get("interrupted") is True
    assert client.calls == 1
    assert [type(e) for e in write_errors] == [turnkit.LostClaim]
    texts = [m.text for m in await conversation.messages()]
    assert late_text not in texts, (
        "T82: the tool's conversation.say after cancel was persisted; behaviour §5.4/§5.9 fence a cancelled "
        f"execution's writes (write errors: {write_errors!r}); messages: {texts}"
    )


async def test_a_late_completion_after_the_execution_was_interrupted_is_dropped(tk: TurnKit) -> None:
    """T103: a tool that CASes its own execution to ``interrupted`` and then returns a result: the execution stays
    ``interrupted`` with no result, the late completion appends no result message (the call's only one is the
    interrupted result) and emits no ``tool_call.completed``."""
    cas_results: list[turnkit.ToolExecutionRecord | None] = []
    events: list[turnkit.Event] = []
    turnkit.configure(on_event=events.append)

    async def self_interrupting(context: turnkit.ToolContext) -> dict[str, Any]:
        """Interrupt your own execution record, then return a result anyway."""
        async with tk.store.atomic(turn_id=context.root_turn_id) as tx:
            cas_results.append(
                await tx.claim_tool_execution(
                    context.execution_id,
                    from_="running",
                    to="interrupted",
                    error={"message": "interrupted under the tool"},
                    completed_at=utcnow(),
                )
            )
        return {"late": True}

    client = ScriptedClient([call_tools(("self_interrupting", {})), "after"])
    agent = turnkit.Agent("selfish", model="scripted", tools=[turnkit.tool(self_interrupting)], client=client)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("go")

    assert turn.status in TERMINAL
    assert len(cas_results) == 1 and cas_results[0] is not None, "the tool's own CAS to interrupted must win"
    [execution] = await turn.tool_executions()
    assert execution.status == "interrupted" and execution.result is None
    assert execution.error == {"message": "interrupted under the tool"}
    results = [m for m in await conversation.messages() if m.role == "tool"]
    assert not any('"late": true' in (p.get("text") or "") for m in results for p in m.content), "late result kept"
    # The late result is dropped; the call still gets exactly one result, the interrupted one (its error),
    # so the next request keeps invariant 8 (every tool call has a result). TurnKit's Ruby case appends none.
    [result] = [m for m in results if m.tool_execution_id == execution.id]
    assert result.metadata.get("interrupted") is True and "interrupted under the tool" in result.content[0]["text"]
    assert not [e for e in events if e.type == "tool_call.completed"], "a dropped completion is not 'completed'"
    assert turn.status == "completed" and client.calls == 2
    assert [m["role"] for m in client.requests[1].messages] == ["user", "assistant", "tool"]


async def test_a_tool_can_say_while_its_call_is_open(tk: TurnKit) -> None:
    async def progress(context: turnkit.ToolContext) -> dict[str, Any]:
        """Report progress into the conversation."""
        message = await context.say("halfway there", metadata={"kind": "progress"})
        return {"message_id": message.id}

    client = ScriptedClient([call_tools(("progress", {})), "done"])
    conversation = await tk.conversation(
        turnkit.Agent("reporter", model="scripted", tools=[turnkit.tool(progress)], client=client)
    )
    turn = await conversation.ask("go")
    assert turn.status == "completed"
    [execution] = await turn.tool_executions()
    [said] = [m for m in await conversation.messages() if m.text == "halfway there"]
    assert execution.result == {"message_id": said.id}
    assert said.role == "user" and said.metadata == {"kind": "progress", "tool_execution_id": execution.id}


async def test_a_completed_calls_context_refuses_to_write(tk: TurnKit) -> None:
    """T49: the fenced writes of a completed execution (its ``ToolContext``) raise ``LostClaim`` and write nothing."""
    kept: list[turnkit.ToolContext] = []

    async def remember(context: turnkit.ToolContext) -> dict[str, Any]:
        """Keep the context for later."""
        kept.append(context)
        return {"kept": True}

    client = ScriptedClient([call_tools(("remember", {})), "done"])
    conversation = await tk.conversation(
        turnkit.Agent("t49", model="scripted", tools=[turnkit.tool(remember)], client=client)
    )
    turn = await conversation.ask("go")
    assert turn.status == "completed"
    [execution] = await turn.tool_executions()
    assert execution.status == "completed"
    before = [m.id for m in await conversation.messages()]
    [context] = kept
    with pytest.raises(turnkit.LostClaim):
        await context.say("too late")
    assert [m.id for m in await conversation.messages()] == before, "T49: the refused write must leave no trace"


async def test_reconciling_a_call_that_has_its_result_appends_no_second_one(tk: TurnKit) -> None:
    """T102: a call that already has its tool_result, reconciled (the store-wide repair, and the lost-call path that
    records an interrupted call), gets no second result; its execution and the turn are unchanged."""
    since = utcnow()
    events: list[turnkit.Event] = []
    turnkit.configure(on_event=events.append)

    @turnkit.tool
    def lookup() -> dict[str, Any]:
        """Look something up."""
        return {"found": True}

    client = ScriptedClient([call_tools(("lookup", {})), "done"])
    conversation = await tk.conversation(turnkit.Agent("t102", model="scripted", tools=[lookup], client=client))
    turn = await conversation.ask("go")
    assert turn.status == "completed"
    [execution] = await turn.tool_executions()
    before = await conversation.messages()
    assert [m.tool_execution_id for m in before if m.kind == "tool_result"] == [execution.id]

    await tk.reconcile(since=since, grace=0)
    call = ToolCallRef(id=execution.tool_call_id, name="lookup")
    settle = SettleToolCall(
        turn_id=turn.id, conversation_id=conversation.id, call=call, outcome="interrupted", message="lost"
    )
    outcome = await TurnActivities(tk.store).settle_tool(settle)

    assert outcome.status == "completed" and outcome.execution_id == execution.id
    after = await conversation.messages()
    assert [(m.id, m.kind) for m in after] == [(m.id, m.kind) for m in before], "T102: no duplicate result"
    [again] = await turn.tool_executions()
    assert (again.status, again.result) == ("completed", {"found": True})
    assert (await turn.refresh()).status == "completed"
    assert not [e for e in events if e.type == "tool_call.interrupted"]
