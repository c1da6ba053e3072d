"""Budgets and cost acceptance cases (behaviour §6, §10 T34, T35, T37, T38, T39) on SQLite and PostgreSQL.

The engine tests run real turns on the session's Temporal dev server through the ``tk`` fixture; the T37 test works
on store records alone, through a store reopened on the same database (a restart).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

import turnkit
from tests.engine import Engine, eventually, running_turn_record, turn_for_activities
from turnkit._activities.model import ModelActivities
from turnkit._engine.budget import (
    COST_LIMIT,
    MAX_ITERATIONS,
    MAX_TOOL_EXECUTIONS,
    counts_against_budget,
    iteration_denial,
    spend_denial,
    tool_execution_denial,
)
from turnkit._engine.charges import charge_turn
from turnkit._engine.current import current_connection
from turnkit._engine.executions import open_tool_execution
from turnkit.config import configure
from turnkit.cost import cost_from_usage
from turnkit.kernel.payloads import ModelCall
from turnkit.kernel.records import TreeUsage
from turnkit.kernel.turn_state import BudgetLimits, TurnState
from turnkit.media_requests import PaintRequest
from turnkit.media_tools import ImageTool, paint_in_turn, view_media_in_turn
from turnkit.model import Usage
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools, image, say

BUDGET_ERROR = "TurnKit::BudgetError"


def tool_results(request: turnkit.ModelRequest) -> list[dict[str, Any]]:
    """The structured tool results a model request carries, in order."""
    return [json.loads(m["content"]) for m in request.messages if m["role"] == "tool"]


def budget_denied(execution: Any) -> bool:
    return bool(((execution.error or {}).get("details") or {}).get("budget_denied"))


# -- T34: max_spend ---------------------------------------------------------------------------------------------------


async def test_spend_above_max_spend_fails_the_turn_and_keeps_the_cost(tk: TurnKit) -> None:
    """T34: with ``max_spend=0.01``, a model call reporting cost 0.02 fails the run with ``BudgetError`` "cost limit
    reached", and ``run.cost.total`` keeps the observed 0.02; the response was persisted before the check."""
    client = ScriptedClient([say("expensive", usage=Usage(input_tokens=10, output_tokens=5, cost=0.02))])
    spender = turnkit.Agent("spender", model="scripted", client=client, max_spend=0.01)
    run = await tk.run(spender, "spend")

    assert run.status == "failed", f"expected the cost limit to fail the run, got {run.status} ({run.error})"
    assert run.error == {"class": "TurnKit::BudgetError", "message": "cost limit reached"}  # spec §6.1 literals
    assert run.cost.total == pytest.approx(0.02)  # the observed cost is kept, not rolled back
    assert (await run.tree_cost()).total == pytest.approx(0.02)
    assert run.usage.total_tokens == 15
    assert client.calls == 1
    # The response was persisted before the limit was compared (behaviour §6.2: observed, not reserved).
    assistant = [m for m in await run.messages() if m.role == "assistant"]
    assert [m.text for m in assistant] == ["expensive"]


async def test_spend_equal_to_max_spend_is_allowed(tk: TurnKit) -> None:
    """T34, its boundary: a cost equal to ``max_spend`` (0.02) is allowed and the run completes, since §6.1 fails
    only a spend strictly greater than the limit."""
    client = ScriptedClient([say("exact", usage=Usage(input_tokens=10, output_tokens=5, cost=0.02))])
    spender = turnkit.Agent("spender", model="scripted", client=client, max_spend=0.02)
    run = await tk.run(spender, "spend")
    assert run.status == "completed", run.error
    assert run.output_text == "exact"
    assert run.cost.total == pytest.approx(0.02)


# -- T35: cost from configured rates ----------------------------------------------------------------------------------


async def test_cost_rates_price_a_real_turn(tk: TurnKit) -> None:
    """T35: with ``cost_rates["model-a"]`` and usage 1M/500k/100k/200k, the turn, conversation, agent and tree costs
    are all 2.26, and the turn's ``cost_details`` match §6.5 component by component."""
    configure(cost_rates={"model-a": {"input": 1, "output": 2, "cache_read": 0.1, "cache_write": 1.25}})
    usage = Usage(input_tokens=1_000_000, output_tokens=500_000, cached_tokens=100_000, cache_write_tokens=200_000)
    client = ScriptedClient([say("priced", usage=usage)])
    agent_name = f"pricer-{uuid.uuid4().hex[:12]}"  # unique: the agent-wide sum below reads every turn with it
    pricer = turnkit.Agent(agent_name, model="model-a", client=client)
    run = await tk.run(pricer, "price this")

    assert run.status == "completed", run.error
    assert client.requests[0].model == "model-a"
    assert run.cost.total == pytest.approx(2.26)  # turn.cost
    # Costs are Cost objects (behaviour §6.5): by component, from the turn's cost_details (Cost.from_record).
    by_component = {"input": 1.0, "output": 1.0, "cache_read": 0.01, "cache_write": 0.25, "thinking": 0.0}
    assert run.turn_cost.components == pytest.approx(by_component)
    assert turnkit.Cost.from_record(run.record).components == pytest.approx(by_component)
    assert (await tk.turn(run.id).refresh()).cost.to_dict() == pytest.approx({**by_component, "total": 2.26})
    assert (await run.tree_cost()).total == pytest.approx(2.26)  # Run#cost over the root tree
    conversation = await tk.load_conversation(run.record.conversation_id)
    assert (await conversation.cost()).total == pytest.approx(2.26)  # Conversation#cost: over its turns
    assert (await conversation.usage()).total_tokens == 1_800_000
    with current_connection(tk):  # what `async with turnkit.connect()` does
        assert (await pricer.cost()).total == pytest.approx(2.26)  # Agent#cost: every stored turn with its name
        assert (await pricer.usage()).total_tokens == 1_800_000
    assert run.record.usage["cost_details"] == pytest.approx(
        {"input": 1.0, "output": 1.0, "cache_read": 0.01, "cache_write": 0.25, "thinking": 0.0, "total": 2.26}
    )
    assert run.usage.total_tokens == 1_800_000
    assert run.record.usage["total_tokens"] == 1_800_000


# -- T37: budgets rebuilt from records --------------------------------------------------------------------------------


async def test_budgets_are_rebuilt_from_records_after_a_restart(store: Store, database_url: str) -> None:
    """T37: from persisted iterations=1, cost 0.05 and one completed ``status_tool`` execution, a store reopened on
    the same database denies another ``status_tool``, allows one more iteration and denies the next, and denies
    adding 0.06 to the spend ("cost limit reached")."""
    limits = turnkit.Agent(
        "t37", model="scripted", max_iterations=2, max_tool_executions_by_name={"status_tool": 1}, max_spend=0.10
    ).budget_limits()
    # A sub-agent with loose limits of its own: only the root's snapshot counts for the tree (behaviour §6.1).
    loose = turnkit.Agent("t37-child", model="scripted", max_iterations=50, max_spend=100.0).budget_limits()

    # Persisted state before the "crash": iterations=1, cost 0.05, one completed status_tool execution, plus
    # executions that must not count (cancelled, budget-denied) and a child turn that has not run yet.
    async with store.atomic() as tx:
        conversation = await tx.create_conversation(agent_name="t37")
        child_conversation = await tx.create_conversation(agent_name="t37-child")
    async with store.atomic(conversation_id=conversation.id) as tx:
        root = await tx.create_turn(
            conversation_id=conversation.id,
            agent_name="t37",
            status="running",
            options={"budget_limits": limits, "state": {"iterations": 1}},
        )
        root = await tx.update_turn(root.id, cost=0.05)
        await tx.create_tool_execution(
            turn_id=root.id, tool_call_id="call_done", tool_name="status_tool", status="completed", result={"ok": 1}
        )
        await tx.create_tool_execution(
            turn_id=root.id, tool_call_id="call_skipped", tool_name="status_tool", status="cancelled"
        )
        await tx.create_tool_execution(
            turn_id=root.id,
            tool_call_id="call_denied",
            tool_name="status_tool",
            status="failed",
            error={"message": "maximum executions reached for tool status_tool", "details": {"budget_denied": True}},
        )
    async with store.atomic(conversation_id=child_conversation.id) as tx:
        child = await tx.create_turn(
            conversation_id=child_conversation.id,
            agent_name="t37-child",
            root_turn_id=root.id,
            parent_turn_id=root.id,
            status="running",
            options={"budget_limits": loose, "depth": 1, "state": {"iterations": 0}},
        )
    await store.close()

    # "Restart": a fresh store on the same database; nothing but the rows is carried over.
    restarted = await Store.open(database_url)
    try:
        child = await restarted.load_turn(child.id)
        root = await restarted.load_turn(child.root_turn_id)
        tree = await restarted.list_turns(root_turn_id=root.id)
        executions = await restarted.list_tool_executions(root_turn_id=root.id)
        assert {t.id for t in tree} == {root.id, child.id}
        assert [counts_against_budget(e) for e in executions] == [True, False, False]
        # issue 9: the root's running totals, which the reservations read, are the sums over these records.
        assert await _tree_usage(restarted, root.id) == TreeUsage.from_records(tree, executions)

        # Reserving another status_tool is denied (one completed already; cancelled/denied ones do not count) ...
        by_name = "maximum executions reached for tool status_tool"
        assert tool_execution_denial(root, executions, "status_tool") == by_name
        async with restarted.atomic(turn_id=root.id) as tx:
            denied, denial = await open_tool_execution(
                tx, child, tool_call_id="call_again", tool_name="status_tool", arguments={}
            )
        assert denial == by_name
        assert denied.status == "failed" and budget_denied(denied)
        # ... while other tools still fit, and the denied reservation itself uses no budget.
        executions = await restarted.list_tool_executions(root_turn_id=root.id)
        assert len(executions) == 4 and sum(counts_against_budget(e) for e in executions) == 1
        assert tool_execution_denial(root, executions, "other_tool") is None

        # One more iteration succeeds (1 of 2 used over the tree) and the next is denied.
        assert iteration_denial(root, tree) is None
        async with restarted.atomic(turn_id=root.id) as tx:
            await tx.update_turn(child.id, options=child.options.with_state(TurnState(iterations=1)))
        tree = await restarted.list_turns(root_turn_id=root.id)
        assert sum(t.options.state.iterations for t in tree) == 2
        assert iteration_denial(root, tree) == MAX_ITERATIONS == "maximum iterations reached"

        # Spend: 0.05 seeded; reaching exactly 0.10 is allowed, adding 0.06 (0.11 > 0.10) is denied.
        assert spend_denial(root, tree) is None
        async with restarted.atomic(turn_id=root.id) as tx:
            await tx.update_turn(child.id, cost=0.05)
        tree = await restarted.list_turns(root_turn_id=root.id)
        assert spend_denial(root, tree) is None
        async with restarted.atomic(turn_id=root.id) as tx:
            await tx.update_turn(child.id, cost=0.06)
        tree = await restarted.list_turns(root_turn_id=root.id)
        assert sum(t.cost or 0.0 for t in tree) == pytest.approx(0.11)
        assert spend_denial(root, tree) == COST_LIMIT == "cost limit reached"
        executions = await restarted.list_tool_executions(root_turn_id=root.id)
        usage = await _tree_usage(restarted, root.id)
        assert usage == TreeUsage.from_records(tree, executions)
        assert usage == TreeUsage(
            iterations=2, tool_executions=1, tool_executions_by_name={"status_tool": 1}, cost=0.11
        )
        assert spend_denial(root, usage) == COST_LIMIT and iteration_denial(root, usage) == MAX_ITERATIONS
    finally:
        await restarted.close()


async def _tree_usage(store: Store, root_turn_id: str) -> TreeUsage:
    async with store.atomic() as tx:
        return await tx.tree_usage(root_turn_id)


# -- T38: tree-wide tool budget with parallel children ----------------------------------------------------------------


async def test_parallel_children_share_max_tool_executions(tk: TurnKit) -> None:
    """T38: with ``max_tool_executions=3`` on the root, two parallel sub-agent children calling a shared counting tool
    run it once, exactly one child fails with "maximum tool executions", and the parent still completes."""
    runs: list[str] = []

    @turnkit.tool
    def counting(who: str) -> dict[str, Any]:
        """Count a call."""
        runs.append(who)
        return {"count": len(runs)}

    def child(name: str) -> turnkit.Agent:
        def script(request: turnkit.ModelRequest) -> turnkit.Result:
            if request.messages[-1]["role"] == "tool":
                return turnkit.Result.build(text=f"{name} done")
            return call_tools(("counting", {"who": name}))

        # The child's own, looser limit is ignored: the root's snapshot applies to the whole tree.
        return turnkit.Agent(
            name, model="scripted", tools=[counting], client=ScriptedClient(script), max_tool_executions=100
        )

    client = ScriptedClient([call_tools(("c1", {"task": "x"}), ("c2", {"task": "y"})), "parent done"])
    boss = turnkit.Agent(
        "boss", model="scripted", sub_agents=[child("c1"), child("c2")], client=client, max_tool_executions=3
    )
    turn = await (await tk.conversation(boss)).ask("go")

    # Two delegations + one counting call use the 3 allowed executions.
    assert len(runs) == 1, f"the shared tool must run exactly once, ran {len(runs)} times: {runs}"
    tree = await tk.store.list_turns(root_turn_id=turn.id)
    children = sorted((t for t in tree if t.id != turn.id), key=lambda t: t.agent_name)
    assert [c.agent_name for c in children] == ["c1", "c2"]
    failed = [c for c in children if c.status == "failed"]
    completed = [c for c in children if c.status == "completed"]
    assert len(failed) == 1 and len(completed) == 1, [(c.agent_name, c.status, c.error) for c in children]
    assert failed[0].error == {"class": BUDGET_ERROR, "message": MAX_TOOL_EXECUTIONS}
    assert completed[0].agent_name == runs[0]  # the child whose call ran is the one that completed
    assert completed[0].output_text == f"{runs[0]} done"

    executions = await tk.store.list_tool_executions(root_turn_id=turn.id)
    counting_runs = [e for e in executions if e.tool_name == "counting"]
    assert sorted(e.status for e in counting_runs) == ["completed", "failed"]
    [denied] = [e for e in executions if budget_denied(e)]
    assert denied.tool_name == "counting" and denied.turn_id == failed[0].id
    assert sum(counts_against_budget(e) for e in executions) == 3

    # The parent still completes; its second request carries one completed and one budget-failed child result.
    assert turn.status == "completed", turn.error
    assert turn.output_text == "parent done" and client.calls == 2
    results = tool_results(client.requests[1])
    assert sorted(r["status"] for r in results) == ["completed", "failed"], results
    [child_success] = [r for r in results if r["status"] == "completed"]
    assert child_success["result"] == f"{runs[0]} done"
    [child_failure] = [r for r in results if r["status"] == "failed"]
    assert child_failure["error"] == {"class": BUDGET_ERROR, "message": MAX_TOOL_EXECUTIONS}


# -- T39: tree-wide max_iterations with concurrent children -----------------------------------------------------------


async def test_parallel_children_share_max_iterations(tk: TurnKit) -> None:
    """T39: with ``max_iterations=2`` and a first call spawning two concurrent children, the tree persists 2
    iterations, only one child's model is called, and the parent fails with "maximum iterations reached"."""
    child_clients = {name: ScriptedClient([f"{name} answer"]) for name in ("k1", "k2")}
    children = [
        # Each child's own limit (10) is ignored: the root's max_iterations=2 covers the whole tree.
        turnkit.Agent(name, model="scripted", client=client, max_iterations=10)
        for name, client in child_clients.items()
    ]
    client = ScriptedClient([call_tools(("k1", {"task": "one"}), ("k2", {"task": "two"})), "never asked"])
    boss = turnkit.Agent("boss", model="scripted", sub_agents=children, client=client, max_iterations=2)
    turn = await (await tk.conversation(boss)).ask("go")

    tree = await tk.store.list_turns(root_turn_id=turn.id)
    assert len(tree) == 3
    iterations = {t.agent_name: t.options.state.iterations for t in tree}
    assert sum(iterations.values()) == 2, f"iterations persisted over the tree: {iterations}"
    calls = {name: c.calls for name, c in child_clients.items()}
    assert sorted(calls.values()) == [0, 1], f"only one child's model may be called: {calls}"

    called = next(name for name, n in calls.items() if n == 1)
    by_name = {t.agent_name: t for t in tree if t.id != turn.id}
    uncalled = by_name["k2" if called == "k1" else "k1"]
    assert by_name[called].status == "completed" and by_name[called].output_text == f"{called} answer"
    assert uncalled.status == "failed"
    assert uncalled.error == {"class": BUDGET_ERROR, "message": MAX_ITERATIONS}
    assert iterations == {"boss": 1, called: 1, uncalled.agent_name: 0}

    # The parent's second request is denied: it fails, and its model was called only once.
    assert turn.status == "failed"
    assert turn.error == {"class": BUDGET_ERROR, "message": MAX_ITERATIONS}
    assert client.calls == 1


# -- per-turn budget (behaviour §1.4 build_turn budget) -------------------------------------------------------------


@turnkit.tool
def ping() -> str:
    """Ping."""
    return "pong"


async def test_a_per_turn_budget_overrides_the_agents_limits(tk: TurnKit) -> None:
    """``ask(budget=...)`` limits this turn's tree over the agent's limits (the others are kept); a bad budget is an
    InputError before anything is written."""
    client = ScriptedClient([call_tools(("ping", {})), "never reached"])
    agent = turnkit.Agent("pinger", model="scripted", client=client, tools=[ping], max_tool_executions=7)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("ping once", budget={"max_iterations": 1})

    assert turn.status == "failed" and turn.error == {"class": BUDGET_ERROR, "message": MAX_ITERATIONS}
    assert client.calls == 1
    limits = turn.record.options.budget_limits
    assert limits is not None and (limits.max_iterations, limits.max_tool_executions) == (1, 7)
    with pytest.raises(turnkit.InputError, match="unknown budget limit: max_iters"):
        await conversation.ask("x", budget={"max_iters": 2})
    with pytest.raises(turnkit.InputError, match="max_iterations must be an integer >= 1"):
        await conversation.ask("x", budget={"max_iterations": 0})
    assert len(await conversation.turns()) == 1


async def test_a_child_that_overspent_stops_its_parent_before_another_model_call(tk: TurnKit) -> None:
    """Behaviour §6.2, loop start: the tree's seeded spend is checked before each model call, so once a sub-agent's
    call took the tree over the root's ``max_spend``, the parent fails with "cost limit reached" without asking its
    model again (it used to make one more call and fail only after paying for it)."""
    child_client = ScriptedClient([say("pricey", usage=Usage(input_tokens=10, output_tokens=5, cost=0.02))])
    child = turnkit.Agent("spendy_child", description="Spends.", model="scripted", client=child_client)
    parent_client = ScriptedClient([call_tools(("spendy_child", {"task": "spend"})), "never asked"])
    parent = turnkit.Agent("spend_parent", model="scripted", sub_agents=[child], client=parent_client, max_spend=0.01)
    run = await tk.run(parent, "delegate")

    assert run.status == "failed" and run.error == {"class": BUDGET_ERROR, "message": COST_LIMIT}
    assert parent_client.calls == 1, "the parent asked its model again after the tree overspent"
    assert child_client.calls == 1
    assert (await run.tree_cost()).total == pytest.approx(0.02)


# -- a budget check before every paid call ----------------------------------------------------------------------------


class GatedImages:
    """An image client whose ``paint`` waits for ``gate`` before answering ``answer``; counts its calls."""

    def __init__(self, answer: turnkit.Result, gate: asyncio.Event) -> None:
        self.answer, self.gate = answer, gate
        self.calls = 0

    async def paint(self, request: PaintRequest) -> turnkit.Result:
        self.calls += 1
        await self.gate.wait()
        return self.answer


@pytest.mark.parametrize("second_call", ["paint", "view_media"])
async def test_parallel_media_calls_never_pay_past_the_limit(tk: TurnKit, second_call: str) -> None:
    """Behaviour §6.2, the budget is checked before every paid call, paint and view_media included (so the painter
    specialist's too): two sub-agents work in parallel under the root's max_spend of 0.04. The second one's tool
    starts first and waits; the first one's image (0.05) takes the tree over the limit; then the second asks to
    paint (or to view that image) and is refused before its call. The providers answered exactly the one call the
    store charged, and the spend passed the limit by that one call only."""
    store = tk.store
    entered = asyncio.Event()
    png = b"\x89PNG\r\n\x1a\n" + uuid.uuid4().bytes
    media_id = "media_" + hashlib.sha256(png).hexdigest()[:24]
    first_images = GatedImages(image(png, usage=Usage(output_tokens=5, cost=0.05)), entered)
    second_client = ScriptedClient(["a cat"], images=[image(png, usage=Usage(output_tokens=5, cost=0.05))])

    @turnkit.tool(name="late_media")
    async def late_media(prompt: str, context: turnkit.ToolContext) -> dict[str, Any]:
        """Paint, or look at the first painter's image, once the first painter has been charged.

        Args:
            prompt: What to paint or look for.
        """
        entered.set()

        async def spent() -> bool:
            async with store.reads() as tx:
                return (await tx.tree_usage(context.root_turn_id)).cost > 0.04

        await eventually(spent, what="the first painter's charge")
        if second_call == "paint":
            return await paint_in_turn(context, prompt, model="scripted-image", client=second_client)
        return await view_media_in_turn(context, media_id, objective=prompt, client=second_client)

    first = turnkit.Agent(
        "first_painter",
        description="Paints a cat.",
        model="scripted",
        tools=[ImageTool(model="scripted-image", client=first_images)],  # type: ignore[arg-type]
        client=ScriptedClient([call_tools(("paint", {"prompt": "a cat"})), "never"]),
    )
    second = turnkit.Agent(
        "second_worker",
        description="Paints or looks.",
        model="scripted",
        tools=[late_media],
        client=ScriptedClient([call_tools(("late_media", {"prompt": "a dog"})), "never"]),
    )
    lead = turnkit.Agent(
        "media_lead",
        model="scripted",
        sub_agents=[first, second],
        client=ScriptedClient([call_tools(("first_painter", {"task": "cat"}), ("second_worker", {"task": "dog"}))]),
        max_spend=0.04,
    )
    run = await tk.run(lead, "paint both")

    assert run.status == "failed" and run.error == {"class": BUDGET_ERROR, "message": COST_LIMIT}
    assert first_images.calls == 1  # the call in flight when the limit was passed
    assert second_client.paint_requests == [] and second_client.calls == 0  # the refused call was never made
    assert (await run.tree_cost()).total == pytest.approx(0.05)  # and nothing after it
    executions = {e.tool_name: e for e in await store.list_tool_executions(root_turn_id=run.id)}
    refused = executions["late_media"]
    assert refused.status == "failed" and (refused.error or {}).get("message") == COST_LIMIT


async def test_a_retried_model_call_asks_no_summary_over_the_limit(engine: Engine) -> None:
    """Behaviour §6.2 before the compaction summary's call: a model activity's first attempt reserved its request and
    died (its summariser and model calls failed); meanwhile another call of the tree took it over max_spend. The
    retry of the same request (whose reservation is not checked again) refuses the summary before asking for it,
    and the step says "cost limit reached": no model is asked a second time."""
    tk = engine.tk
    calls: list[str] = []

    def answer(request: turnkit.ModelRequest) -> turnkit.Result:
        calls.append("summary" if request.metadata.get("compaction") else "main")
        raise RuntimeError("worker lost")  # not a ModelError: Temporal would retry the activity

    agent = turnkit.Agent(
        "summary_over_budget", model="scripted", client=ScriptedClient(answer), compaction={"tail_messages": 1}
    )
    turnkit.register(agent)
    conversation = await tk.conversation(agent)
    for i in range(3):
        await conversation.say(f"note {i}")
    record = await turn_for_activities(tk, conversation, "go")
    # As ask(compact=True) builds it: compaction forced before the first request, the agent's limits snapshotted.
    options = record.options.model_copy(update={"compact": True, "budget_limits": BudgetLimits(max_spend=0.01)})
    async with tk.store.atomic() as tx:
        await tx.update_turn(record.id, options=options)
    call = ModelCall(turn_id=record.id, root_turn_id=record.id, request_id="req_1", iteration=1, audit_apart=True)
    env = ActivityEnvironment()
    with pytest.raises(RuntimeError, match="worker lost"):
        await env.run(ModelActivities(tk.store).model, call)
    assert calls == ["summary", "main"]
    async with tk.store.atomic(turn_id=record.id) as tx:  # another call of the tree, charged meanwhile
        turn = await tx.load_turn(record.id)
        await charge_turn(tx, turn, Usage(input_tokens=1, cost=0.02), cost_from_usage(Usage(cost=0.02), "scripted"))

    step = await env.run(ModelActivities(tk.store).model, call)

    assert step.outcome == "budget_exceeded" and step.budget_error == COST_LIMIT
    assert calls == ["summary", "main"]  # nothing asked again


def test_a_limit_is_the_snapshots_else_the_process_settings() -> None:
    """A root's limit (``limit_of``, and ``limits_of`` for all of them) is its snapshot's when the snapshot sets it,
    to a value or to None (no limit), and the process settings' when it leaves it unset or has no snapshot (rows
    older than a limit)."""
    from turnkit._engine.budget import limit_of, limits_of
    from turnkit.kernel.turn_state import TurnOptions

    configure(max_iterations=7, max_spend=2.5, max_tool_executions_by_name={"search": 3}, timeout=90)
    settings = {
        "max_iterations": 7,
        "timeout": 90,
        "max_depth": 3,
        "max_tool_executions": 100,
        "max_tool_executions_by_name": {"search": 3},
        "max_spend": 2.5,
    }
    cases = [
        (None, settings),
        (BudgetLimits(), settings),
        (BudgetLimits(max_iterations=2, max_spend=None), {**settings, "max_iterations": 2, "max_spend": None}),
        (
            BudgetLimits(max_tool_executions_by_name={"paint": 1}, max_depth=0, timeout=5.0, max_tool_executions=None),
            {
                **settings,
                "max_tool_executions_by_name": {"paint": 1},
                "max_depth": 0,
                "timeout": 5.0,
                "max_tool_executions": None,
            },
        ),
    ]
    for snapshot, expected in cases:
        root = running_turn_record(TurnOptions(budget_limits=snapshot))
        assert {name: limit_of(root, name) for name in BudgetLimits.model_fields} == expected, snapshot
        assert limits_of(root).model_dump() == expected, snapshot
