"""The turn loop on a real Temporal dev server and real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
import temporalio.activity
from temporalio.api.enums.v1 import EventType
from temporalio.testing import ActivityEnvironment

import turnkit
from tests.engine import HeldModel, eventually, start_turn_workflow
from tests.history_scenarios import history_events, local_activity_types, scheduled_activities
from turnkit._activities.model import ModelActivities
from turnkit._engine.ids import new_id
from turnkit.kernel.errors import TransientModelError
from turnkit.kernel.payloads import ModelCall, SubmitTurn
from turnkit.kernel.records import INTERRUPTED_MESSAGE
from turnkit.model import Result
from turnkit.prompt import project_messages
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool(recovery="replay_safe")
def lookup(q: str) -> dict[str, Any]:
    """Look something up.

    Args:
        q: The query.
    """
    return {"answer": q.upper()}


@turnkit.tool
def boom(reason: str) -> dict[str, Any]:
    """Always fails with a ToolError."""
    raise turnkit.ToolError(f"boom: {reason}")


def agent(client: ScriptedClient | HeldModel, **limits: Any) -> turnkit.Agent:
    return turnkit.Agent("tester", model="scripted", tools=[lookup, boom], client=client, **limits)


async def test_three_iteration_tool_turn(tk: TurnKit) -> None:
    client = ScriptedClient(
        [
            call_tools(("lookup", {"q": "a"}), ("lookup", {"q": "b"})),
            call_tools(("lookup", {"q": "c"})),
            "all done",
        ]
    )
    conversation = await tk.conversation(agent(client))
    turn = await conversation.ask("look things up")

    assert turn.status == "completed", turn.error
    assert turn.output_text == "all done"
    messages = await conversation.messages()
    assert [m.sequence for m in messages] == list(range(1, len(messages) + 1))
    assert [(m.role, m.kind) for m in messages] == [
        ("user", "text"),
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("tool", "tool_result"),
        ("assistant", "tool_call"),
        ("tool", "tool_result"),
        ("assistant", "text"),
    ]
    executions = await turn.tool_executions()
    assert [e.status for e in executions] == ["completed"] * 3
    assert [e.result for e in executions] == [{"answer": "A"}, {"answer": "B"}, {"answer": "C"}]
    assert client.calls == 3
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (30, 15)  # 10 + 5 tokens per scripted call
    assert turn.usage.total_tokens > 0
    assert turn.record.options.state.iterations == 3


@turnkit.tool
def typed(count: int) -> dict[str, Any]:
    """Needs an integer."""
    return {"count": count}


async def test_tool_failures_are_results_the_model_sees(tk: TurnKit) -> None:
    client = ScriptedClient(
        [
            call_tools(("boom", {"reason": "bad"}), ("typed", {"count": "many"}), ("nope", {})),
            "recovered",
        ]
    )
    a = turnkit.Agent("tester", model="scripted", tools=[lookup, boom, typed], client=client)
    conversation = await tk.conversation(a)
    turn = await conversation.ask("try")

    assert turn.status == "completed" and turn.output_text == "recovered"
    executions = await turn.tool_executions()
    assert [e.status for e in executions] == ["failed", "failed", "failed"]
    assert executions[0].error == {"message": "boom: bad", "details": {"class": "TurnKit::ToolError"}}
    assert executions[1].error is not None and "count" in executions[1].error["message"]
    assert executions[1].error["details"]["class"] == "TurnKit::ToolValidationError"
    assert executions[2].error is not None and executions[2].error["message"] == "unknown tool: nope"
    # The model's second request carries exactly one error result per call, in call order.
    tool_messages = [m for m in client.requests[1].messages if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [e.tool_call_id for e in executions]
    assert all('"error": true' in m["content"] for m in tool_messages)


async def test_invalid_json_arguments_fail_the_call_not_the_turn(tk: TurnKit) -> None:
    """T17: a call whose arguments are the invalid JSON "{" fails with "invalid JSON arguments", the tool is never
    called, and the turn goes on to "recovered" (the model saw the error as the call's result)."""
    called: list[Any] = []

    @turnkit.tool(name="lookup")
    def counting_lookup(q: str = "") -> dict[str, Any]:
        """Counts its calls."""
        called.append(q)
        return {"answer": q}

    call = turnkit.ToolCall.parse("call_json", "lookup", "{")
    client = ScriptedClient([turnkit.Result.build(tool_calls=[call]), "recovered"])
    a = turnkit.Agent("t17", model="scripted", tools=[counting_lookup], client=client)
    turn = await (await tk.conversation(a)).ask("go")
    assert turn.status == "completed" and turn.output_text == "recovered"
    [execution] = await turn.tool_executions()
    assert execution.status == "failed" and execution.error is not None
    assert execution.error["message"] == "invalid JSON arguments"
    assert called == [], "T17: the tool must never be called"
    [result] = [m for m in client.requests[1].messages if m["role"] == "tool"]
    assert result["tool_call_id"] == execution.tool_call_id
    assert json.loads(result["content"]) == {"error": True, "message": "invalid JSON arguments"}
    assert client.calls == 2


async def test_a_plain_ask_calls_the_client_once_with_the_agents_model_and_one_user_message(tk: TurnKit) -> None:
    """T01: a fake client returning "hello"; ask("Hi") completes with "hello", after one client call with the
    agent's model and a single user message."""
    client = ScriptedClient(["hello"])
    a = turnkit.Agent("t01", model="model-t01", client=client)
    turn = await (await tk.conversation(a)).ask("Hi")
    assert turn.status == "completed" and turn.output_text == "hello"
    assert client.calls == 1
    [request] = client.requests
    assert request.model == "model-t01"
    assert request.messages == [{"role": "user", "content": "Hi"}]


async def test_max_iterations_fails_the_turn(tk: TurnKit) -> None:
    client = ScriptedClient([call_tools(("lookup", {"q": "a"})), "never"])
    conversation = await tk.conversation(agent(client, max_iterations=1))
    turn = await conversation.ask("go")
    assert turn.status == "failed"
    assert turn.error == {"class": "TurnKit::BudgetError", "message": "maximum iterations reached"}
    assert client.calls == 1


async def test_max_tool_executions_fails_the_turn_and_answers_every_call(tk: TurnKit) -> None:
    client = ScriptedClient([call_tools(("lookup", {"q": "a"}), ("lookup", {"q": "b"}), ("lookup", {"q": "c"}))])
    conversation = await tk.conversation(agent(client, max_tool_executions=1))
    turn = await conversation.ask("go")
    assert turn.status == "failed"
    assert turn.error == {"class": "TurnKit::BudgetError", "message": "maximum tool executions reached"}
    executions = await turn.tool_executions()
    assert [e.status for e in executions] == ["completed", "failed", "cancelled"]
    assert executions[1].error is not None and executions[1].error["details"]["budget_denied"] is True
    # Behaviour §5.13 invariant 8: every proposed call has exactly one tool result, even on a failed turn.
    results = [m for m in await conversation.messages() if m.kind == "tool_result"]
    assert sorted(m.content[0]["tool_call_id"] for m in results) == sorted(e.tool_call_id for e in executions)


async def test_max_tool_executions_by_name(tk: TurnKit) -> None:
    """T16: a per-tool limit of 1 and two sequential calls: the turn fails with "maximum executions reached for
    tool lookup", the executions are [completed, failed], the last with ``details.budget_denied``."""
    client = ScriptedClient([call_tools(("lookup", {"q": "a"})), call_tools(("lookup", {"q": "b"})), "never"])
    conversation = await tk.conversation(agent(client, max_tool_executions_by_name={"lookup": 1}))
    turn = await conversation.ask("go")
    assert turn.status == "failed"
    assert turn.error is not None and turn.error["message"] == "maximum executions reached for tool lookup"
    executions = await turn.tool_executions()
    assert [e.status for e in executions] == ["completed", "failed"]
    assert executions[1].error is not None and executions[1].error["details"]["budget_denied"] is True


class SaveReport(turnkit.Tool):
    """Save the report and end the turn."""

    terminal = "Saved the report."

    def call(self, context: turnkit.ToolContext, **arguments: Any) -> dict[str, Any]:
        return {"saved": True}


async def test_terminal_tool_ends_the_turn_and_skips_the_rest(tk: TurnKit) -> None:
    """T15: a terminal call and a sibling after it: the executions are [completed, cancelled], and every projected
    assistant tool-call id has exactly one tool-result message."""
    client = ScriptedClient([call_tools(("save_report", {}), ("lookup", {"q": "late"}))])
    a = turnkit.Agent("tester", model="scripted", tools=[lookup, SaveReport], client=client)
    conversation = await tk.conversation(a)
    turn = await conversation.ask("save")
    assert turn.status == "completed" and turn.output_text == "Saved the report."
    executions = await turn.tool_executions()
    assert [e.status for e in executions] == ["completed", "cancelled"]
    assert executions[1].result == {"skipped": True, "message": "not executed: turn ended by save_report"}
    results = [m for m in await conversation.messages() if m.kind == "tool_result"]
    assert len(results) == 2 and client.calls == 1
    projected = project_messages(await conversation.messages())
    call_ids = [c["id"] for m in projected if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    result_ids = [m["tool_call_id"] for m in projected if m["role"] == "tool"]
    assert len(call_ids) == 2 and sorted(result_ids) == sorted(call_ids)


class SaveNamedReport(turnkit.Tool):
    """Save the report and end the turn; the completion message names it."""

    name = "save_report"
    terminal = staticmethod(lambda result: f"Saved {result['id']}.")

    def call(self, context: turnkit.ToolContext, **arguments: Any) -> dict[str, Any]:
        return {"id": "rep_1"}


async def test_a_terminal_tools_completion_block_is_the_turns_answer(tk: TurnKit) -> None:
    """T14: a terminal tool ``save_report`` whose completion function gives "Saved rep_1." from its result: the turn
    completes with that output, and the execution is completed with the result."""
    client = ScriptedClient([call_tools(("save_report", {}))])
    a = turnkit.Agent("t14", model="scripted", tools=[SaveNamedReport], client=client)
    turn = await (await tk.conversation(a)).ask("save")
    assert turn.status == "completed" and turn.output_text == "Saved rep_1."
    [execution] = await turn.tool_executions()
    assert (execution.tool_name, execution.status, execution.result) == ("save_report", "completed", {"id": "rep_1"})
    assert client.calls == 1


async def test_turn_by_id_from_another_handle(tk: TurnKit) -> None:
    """Spec §1.4: a turn submitted without waiting is returned ``pending`` (here it queues behind a running turn of
    its conversation, so it cannot have started); another handle, by id, waits for its result."""
    held = HeldModel(Result.build(text="first"), then="hi")
    conversation = await tk.conversation(agent(held))
    first = await conversation.ask("one", wait=False)
    await asyncio.wait_for(held.entered.wait(), 30)
    pending = await conversation.ask("hello", wait=False)
    assert pending.status == "pending"
    assert (await tk.store.load_turn(pending.id)).status == "pending" and len(held.requests) == 1
    held.released.set()
    same = await tk.turn(pending.id).result(timeout=30)
    assert same.status == "completed" and same.output_text == "hi"
    assert (await first.result(timeout=30)).output_text == "first"


async def test_unknown_turn_id_raises(tk: TurnKit) -> None:
    with pytest.raises(turnkit.RecordNotFound):
        await tk.turn("turn_000000000000000000000000").result(timeout=5)


async def test_turn_context_policy_audit_and_status_predicates(tk: TurnKit) -> None:
    """``Turn.context`` is a copy of the context the turn was built with; ``policy_audit`` is None when no output
    policy ran; exactly one status predicate is true, the one of the loaded record."""
    agent = turnkit.Agent("plain", model="scripted", client=ScriptedClient(["ok"]))
    conversation = await tk.conversation(agent, context={"tenant": "acme"})
    prepared = await conversation.build_turn("hi", context={"tenant": "globex", "tags": ["a"]})
    context = prepared.context
    context["tags"].append("b")  # a deep copy: the record is unchanged
    assert prepared.context == {"tenant": "globex", "tags": ["a"]}
    predicates = ("is_pending", "is_waiting", "is_paused", "is_running", "is_completed", "is_failed", "is_cancelled")
    assert [p for p in (*predicates, "is_stale") if getattr(prepared, p)] == ["is_pending"]

    turn = await prepared.run()
    assert [p for p in (*predicates, "is_stale") if getattr(turn, p)] == ["is_completed"]
    assert turn.policy_audit is None and turn.is_background
    gated = await conversation.build_turn("again", paused=True)
    assert gated.context == {"tenant": "acme"}  # the conversation's context when the turn gives none
    assert [p for p in (*predicates, "is_stale") if getattr(gated, p)] == ["is_paused"]
    await gated.cancel()
    assert [p for p in (*predicates, "is_stale") if getattr(gated, p)] == ["is_cancelled"]


async def test_a_replay_safe_tool_failing_twice_after_its_effect_runs_three_times_with_one_key(tk: TurnKit) -> None:
    """T46 (the attempt dies by raising, not by a worker crash: the worker-kill variant is test_crash.py's): a
    replay_safe tool whose first two attempts fail right after their external commit is called 3 times, always with
    the same idempotency key; the effect, keyed by it, happened once; there is one execution record."""
    keys: list[str] = []
    effects: dict[str, int] = {}

    @turnkit.tool(recovery="replay_safe", max_attempts=5, initial_retry_interval=0.1)
    async def sync_inventory(context: turnkit.ToolContext) -> dict[str, Any]:
        """Sync the inventory (an idempotent external write)."""
        keys.append(context.idempotency_key)
        effects.setdefault(context.idempotency_key, len(effects) + 1)  # the external system dedupes by key
        if len(keys) <= 2:
            raise ConnectionError("lost the connection after the external commit")
        return {"synced": effects[context.idempotency_key]}

    client = ScriptedClient([call_tools(("sync_inventory", {})), "synced"])
    a = turnkit.Agent("t46", model="scripted", tools=[sync_inventory], client=client)
    turn = await (await tk.conversation(a)).ask("sync")
    assert turn.status == "completed" and turn.output_text == "synced"
    [execution] = await turn.tool_executions()
    assert execution.status == "completed" and execution.result == {"synced": 1}
    assert keys == [f"turnkit:tool:{execution.id}"] * 3, "T46: 3 calls, one idempotency key"
    assert effects == {keys[0]: 1}, "T46: one external effect"
    assert client.calls == 2


async def test_one_submitted_turn_performed_twice_calls_the_model_once(tk: TurnKit) -> None:
    """T41: a submitted turn performed twice calls the model once and stays completed.

    "Perform" here is a run of the turn's workflow. Two runs at once cannot exist (one open workflow per turn id:
    that is this runtime's claim), but Temporal lets a closed workflow id be started again, so the second perform is
    a second run of ``TurnWorkflow`` for the finished turn, started directly (not through the lane, whose own
    de-duplication would hide it), plus a retried model activity of the first run's request. Only the store's
    reservation stands between them and the model: the committed response found by request id, and the turn's
    status (a completed turn is never reserved again). Without that guard the second run asks the model again.
    Before: the test submitted the same request three times, which the submit activity, the lane and the workflow-id
    uniqueness each absorbed before the model activity was reached, so it could not fail.
    """
    client = ScriptedClient(["once", "twice"])
    conversation = await tk.conversation(agent(client))
    request = SubmitTurn(
        conversation_id=conversation.id, turn_id=new_id("turn"), message_id=new_id("message"), text="do it"
    )
    submit = conversation._submit  # pyright: ignore[reportPrivateUsage]
    await asyncio.gather(submit(request), submit(request))  # a retried submit: one turn, one trigger message
    done = await tk.turn(request.turn_id).result(timeout=60)
    assert (done.status, done.output_text, client.calls) == ("completed", "once", 1)
    first_run = await tk.client.get_workflow_handle(request.turn_id).describe()
    first = await tk.store.load_turn(request.turn_id)

    # The second perform: a new run of the turn's workflow (same id, allowed once the first closed).
    again = await start_turn_workflow(tk.client, first, tk.task_queue)
    assert again.result_run_id != first_run.run_id  # it really ran: the workflow id did not stop it
    await again.result()
    # And a retried model activity of the first run's request (its response committed): answered from the store.
    retried = ModelCall(
        turn_id=first.id, root_turn_id=first.root_turn_id, request_id=first.options.state.request_id or "", iteration=1
    )
    step = await ActivityEnvironment(client=tk.client).run(ModelActivities(tk.store).model, retried)
    assert step.outcome == "completed"

    assert client.calls == 1, f"T41: the model must be called once, was called {client.calls} times"
    record = await tk.store.load_turn(request.turn_id)
    assert (record.status, record.output_text, record.options.state.iterations) == ("completed", "once", 1)
    assert record.completed_at == first.completed_at
    assert [(m.role, m.text) for m in await conversation.messages()] == [("user", "do it"), ("assistant", "once")]
    assert [t.id for t in await conversation.turns()] == [request.turn_id]


async def test_a_blocked_model_call_keeps_heartbeating_and_a_reconcile_leaves_it_running(tk: TurnKit) -> None:
    """T48: a model call blocked well past its 3 s heartbeat timeout keeps heartbeating (Temporal's activity
    heartbeat replaces the gem's ``heartbeat_at`` thread: docs/behaviour.md §5.8), so its first attempt is never
    timed out; a reconcile meanwhile repairs nothing and leaves the turn ``running``; released, the call's answer
    completes the turn after one request. The SDK sends a heartbeat at most every 0.8 timeouts: at 3 s a beat has
    0.6 s to reach the server (at 1 s, 0.2 s was too little for a loaded machine)."""
    turnkit.configure(model_heartbeat_timeout=3.0)
    since = utcnow()
    model = HeldModel(Result.build(text="slow answer"))
    turn = await (await tk.conversation(agent(model))).ask("think", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)
    handle = tk.client.get_workflow_handle(turn.id)

    async def heartbeating_past_the_timeout() -> bool:
        pending = (await handle.describe()).raw_description.pending_activities
        [call] = [a for a in pending if a.activity_type.name == "turnkit.model"]
        assert call.attempt == 1, "the blocked call was timed out and retried"
        if not call.HasField("last_heartbeat_time"):
            return False
        beating = call.last_heartbeat_time.ToDatetime() - call.last_started_time.ToDatetime()
        return beating.total_seconds() > 6.5  # its last beat came more than two heartbeat timeouts after it began

    await eventually(heartbeating_past_the_timeout, what="the blocked model call to heartbeat past its timeout")
    reconciled = await tk.reconcile(since=since, grace=0)
    assert [r for r in reconciled.repairs if turn.id in r.ids] == []
    assert (await turn.refresh()).status == "running"
    model.released.set()
    done = await turn.result(timeout=60)
    assert (done.status, done.output_text) == ("completed", "slow answer")
    assert len(model.requests) == 1


# -- local tool calls (@tool(local=True)) -----------------------------------------------------------------------------


@turnkit.tool(name="lookup", recovery="replay_safe", local=True)
def local_lookup(q: str) -> dict[str, Any]:
    """Look something up, as a local activity.

    Args:
        q: The query.
    """
    return {"answer": q.upper()}


async def test_a_local_replay_safe_tool_whose_attempt_fails_runs_again_as_an_activity(tk: TurnKit) -> None:
    """T46 for a local tool: the first attempt (local) raises after its effect; the second runs as a regular activity
    (with the tool's retry policy), with the same execution and idempotency key, and counts as attempt 2."""
    seen: list[tuple[int, str]] = []

    @turnkit.tool(name="sync_inventory", recovery="replay_safe", local=True, initial_retry_interval=0.1)
    async def sync_inventory(context: turnkit.ToolContext) -> dict[str, Any]:
        """Sync the inventory (an idempotent external write)."""
        seen.append((context.attempt, context.idempotency_key))
        if context.attempt == 1:
            raise ConnectionError("lost the connection after the external commit")
        return {"synced": True}

    client = ScriptedClient([call_tools(("sync_inventory", {})), "synced"])
    a = turnkit.Agent("local_t46", model="scripted", tools=[sync_inventory], client=client)
    turn = await (await tk.conversation(a)).ask("sync")
    assert (turn.status, turn.output_text) == ("completed", "synced"), turn.error
    [execution] = await turn.tool_executions()
    assert (execution.status, execution.result) == ("completed", {"synced": True})
    assert seen == [(1, f"turnkit:tool:{execution.id}"), (2, f"turnkit:tool:{execution.id}")]
    events = await history_events(tk, turn.id)
    assert local_activity_types(events).count("tool:sync_inventory") == 1
    assert scheduled_activities(events).count("tool:sync_inventory") == 1


async def test_a_local_at_most_once_tool_that_outlives_its_timeout_is_interrupted_not_run_again(tk: TurnKit) -> None:
    """T47 for a local tool: an at-most-once call whose local attempt times out is recorded "interrupted" (its
    outcome is unknown), never run again, and the model is told so; the turn goes on."""
    runs: list[str] = []

    @turnkit.tool(name="charge_card", local=True, timeout=1)
    async def charge_card(amount: int) -> dict[str, Any]:
        """Charge a card.

        Args:
            amount: Cents.
        """
        runs.append("run")
        await asyncio.sleep(5)
        return {"charged": amount}

    client = ScriptedClient([call_tools(("charge_card", {"amount": 500})), "told the user"])
    a = turnkit.Agent("local_t47", model="scripted", tools=[charge_card], client=client)
    turn = await (await tk.conversation(a)).ask("charge it")
    assert (turn.status, turn.output_text) == ("completed", "told the user"), turn.error
    [execution] = await turn.tool_executions()
    assert (execution.status, execution.error) == ("interrupted", {"message": INTERRUPTED_MESSAGE})
    assert runs == ["run"]
    [result] = [m for m in client.requests[1].messages if m["role"] == "tool"]
    assert "unknown" in result["content"]


# -- local model calls (settings.model_local_activity) ----------------------------------------------------------------


async def test_local_calls_cost_their_turn_no_workflow_task(tk: TurnKit) -> None:
    """The same two-call turn with ``lookup`` and the model calls as activities or as local ones
    (``@tool(local=True)``, ``model_local_activity``): the same transcript, but each local call is a marker of the
    workflow task that runs the next step, so the turn runs one workflow task fewer per local call and schedules no
    activity for it; with both local, the whole turn is one workflow task."""
    tasks: dict[tuple[bool, bool], int] = {}
    for local_tool, local_model in ((False, False), (True, False), (False, True), (True, True)):
        turnkit.configure(model_local_activity=local_model)
        client = ScriptedClient([call_tools(("lookup", {"q": "a"})), call_tools(("lookup", {"q": "b"})), "done"])
        name = f"lookup_{'local' if local_tool else 'activity'}_{'local' if local_model else 'activity'}"
        a = turnkit.Agent(name, model="scripted", tools=[local_lookup if local_tool else lookup], client=client)
        turn = await (await tk.conversation(a)).ask("look up a, then b")
        assert (turn.status, turn.output_text) == ("completed", "done"), turn.error
        assert [(e.status, e.result) for e in await turn.tool_executions()] == [
            ("completed", {"answer": "A"}),
            ("completed", {"answer": "B"}),
        ]
        events = await history_events(tk, turn.id)
        tasks[local_tool, local_model] = sum(
            1 for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        )
        scheduled, local = scheduled_activities(events), local_activity_types(events)
        expected = {"tool:lookup": 2, "turnkit.model": 3}
        for kind, is_local in (("tool:lookup", local_tool), ("turnkit.model", local_model)):
            where, elsewhere = (local, scheduled) if is_local else (scheduled, local)
            assert where.count(kind) == expected[kind] and kind not in elsewhere, (kind, scheduled, local)
    assert tasks[True, False] == tasks[False, False] - 2, tasks  # two tool calls
    assert tasks[False, True] == tasks[False, False] - 3, tasks  # three model calls
    assert tasks[True, True] == 1, tasks  # model, tool, model, tool, model and the finish: one task


@pytest.mark.parametrize(("max_attempts", "left"), [(3, 2), (0, 0)], ids=["three", "unlimited"])
async def test_a_local_model_attempt_that_fails_runs_again_as_an_activity_with_its_request_id(
    tk: TurnKit, max_attempts: int, left: int
) -> None:
    """A transient failure of the local attempt (a 503): the remaining ``model_max_attempts - 1`` attempts (or, with 0,
    unlimited ones, as Temporal reads 0) run as a regular ``turnkit.model`` activity, with the same request id, after
    the provider's ``retry-after``."""
    turnkit.configure(model_local_activity=True, model_max_attempts=max_attempts)
    asked: list[float] = []

    def overloaded(request: turnkit.ModelRequest) -> Result:
        asked.append(time.monotonic())
        raise TransientModelError("APIStatusError: overloaded", retry_after=1.5)

    def answer(request: turnkit.ModelRequest) -> Result:
        asked.append(time.monotonic())
        return Result.build(text="back")

    client = ScriptedClient([overloaded, answer])
    turn = await (await tk.conversation(turnkit.Agent("local_model_retry", model="scripted", client=client))).ask("hi")
    assert (turn.status, turn.output_text) == ("completed", "back"), turn.error
    first, second = client.requests
    assert first.metadata["request_id"] == second.metadata["request_id"]
    assert asked[1] - asked[0] >= 1.5 - 0.05, asked  # the provider's delay, as the activity's own retry would wait
    events = await history_events(tk, turn.id)
    assert local_activity_types(events) == ["turnkit.model"] and scheduled_activities(events) == ["turnkit.model"]
    [scheduled] = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED]
    assert scheduled.activity_task_scheduled_event_attributes.retry_policy.maximum_attempts == left


async def test_a_local_model_attempt_that_fails_for_good_fails_the_turn_without_a_retry(tk: TurnKit) -> None:
    """A ``ModelError`` in the local attempt (a bad request) fails the turn at once, as the activity's retry policy
    (non-retryable ``ModelError``) would: no regular activity, one call to the provider."""
    turnkit.configure(model_local_activity=True)

    def bad_request(request: turnkit.ModelRequest) -> Result:
        raise turnkit.ModelError("BadRequestError: unknown model")

    client = ScriptedClient([bad_request, "never"])
    turn = await (await tk.conversation(turnkit.Agent("local_model_bad", model="scripted", client=client))).ask("hi")
    assert turn.status == "failed"
    assert turn.error is not None and turn.error["class"] == "TurnKit::ModelError", turn.error
    assert turn.error["message"] == "BadRequestError: unknown model"
    assert client.calls == 1
    assert scheduled_activities(await history_events(tk, turn.id)) == []


async def test_a_turn_cancelled_during_a_local_model_call_ends_cancelled(tk: TurnKit) -> None:
    """A cancel made while a local model call runs (it holds the turn's workflow task) ends the turn ``cancelled``
    once the call returns; the answer it brings is not published, and the call never becomes a regular activity."""
    turnkit.configure(model_local_activity=True)
    model = HeldModel(Result.build(text="too late"))
    pending = await (await tk.conversation(agent(model))).ask("hi", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)
    cancelled = await pending.cancel()
    assert cancelled.status == "cancelled"
    model.released.set()
    turn = await pending.result(timeout=30)
    assert (turn.status, turn.output_text) == ("cancelled", "")
    assert len(model.requests) == 1
    assert "turnkit.model" not in scheduled_activities(await history_events(tk, turn.id))


async def test_activities_heartbeat_only_when_a_beat_is_due(tk: TurnKit, monkeypatch: pytest.MonkeyPatch) -> None:
    """A turn's activities heartbeat only when a beat is due (each is a write to the workflow's state on the
    server): never sooner than half the heartbeat timeout after the attempt's start or the last beat. A tool that
    runs past its 1 s heartbeat timeout beats every half timeout and completes (``turnkit/_temporal/heartbeats.py``)."""
    turnkit.configure(tool_heartbeat_timeout=1.0)
    beats: list[str] = []
    early: list[tuple[str, float]] = []
    last_beat: dict[tuple[str, str, int], float] = {}  # per attempt, this test's own clock (not the module's)
    heartbeat = temporalio.activity.heartbeat

    def counted(*details: Any) -> None:
        info = temporalio.activity.info()
        beats.append(info.activity_type)
        # Since the attempt began (the server's start time, same machine) or this attempt's last beat. A short
        # activity on a slow machine may outlive half its timeout and beat once, rightly; a beat sooner is the failure.
        attempt = (info.workflow_id or "", info.activity_id, info.attempt)
        now = time.time()
        since = now - last_beat.get(attempt, info.started_time.timestamp())
        last_beat[attempt] = now
        if since < 0.45:
            early.append((info.activity_type, since))
        heartbeat(*details)

    monkeypatch.setattr(temporalio.activity, "heartbeat", counted)

    @turnkit.tool(recovery="replay_safe")
    async def quick() -> str:
        """Answers at once."""
        return "quick"

    @turnkit.tool(recovery="replay_safe")
    async def slow() -> str:
        """Runs for 1.6 s: past its heartbeat timeout, so only its heartbeats keep it alive."""
        await asyncio.sleep(1.6)
        return "slow"

    agent = turnkit.Agent(
        "beats",
        model="scripted",
        tools=[quick, slow],
        client=ScriptedClient([call_tools(("quick", {})), call_tools(("slow", {})), "done"]),
    )
    turnkit.register(agent)
    turn = await (await tk.conversation(agent)).ask("go")
    assert turn.status == "completed", turn.error
    assert beats.count("tool:slow") >= 2, beats
    assert early == [], (early, beats)
