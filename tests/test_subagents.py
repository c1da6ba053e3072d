"""Sub-agents, launched agents and waits on a real Temporal dev server (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import turnkit
from tests.engine import eventually, held_tool
from turnkit._activities.children import ChildActivities
from turnkit._engine.builtin_tools import launch_agent, wait_for
from turnkit._engine.waits import add_waits
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool(recovery="replay_safe")
async def work(seconds: float) -> dict[str, Any]:
    """Work for a while."""
    await asyncio.sleep(seconds)
    return {"worked": seconds}


@turnkit.tool
def note(text: str) -> dict[str, Any]:
    """Take a note."""
    return {"noted": text}


def worker_agent(name: str, *, seconds: float = 0.4) -> turnkit.Agent:
    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        if request.messages[-1]["role"] == "tool":
            return turnkit.Result.build(text=f"{name} done")
        return call_tools(("work", {"seconds": seconds}))

    return turnkit.Agent(
        name, description=f"The {name}.", model="scripted", tools=[work], client=ScriptedClient(script)
    )


def last_tool_results(request: turnkit.ModelRequest) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in request.messages if m["role"] == "tool"]


async def test_parallel_delegation_returns_results_in_call_order(tk: TurnKit) -> None:
    """T11: each sub-agent call makes a child turn with ``parent_turn_id`` = the parent, in another conversation,
    under the same root; the parent completes."""
    subs = [worker_agent(n) for n in ("alpha", "beta", "gamma")]
    client = ScriptedClient(
        [call_tools(("alpha", {"task": "a"}), ("beta", {"task": "b"}), ("gamma", {"task": "c"})), "merged"]
    )
    boss = turnkit.Agent("boss", model="scripted", sub_agents=subs, client=client)
    conversation = await tk.conversation(boss, principal="owner")
    turn = await conversation.ask("split the work")
    assert turn.status == "completed" and turn.output_text == "merged"

    children = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    assert sorted(c.agent_name for c in children) == ["alpha", "beta", "gamma"]
    assert all(c.status == "completed" and c.parent_turn_id == turn.id for c in children)
    assert all(c.conversation_id != conversation.id for c in children)
    # They ran at the same time: every run overlaps every other.
    for a in children:
        for b in children:
            assert a.started_at and a.completed_at and b.started_at and b.completed_at
            assert a.started_at < b.completed_at
    # The parent's second request carries the three structured results, in call order.
    results = last_tool_results(client.requests[1])
    assert [r["result"] for r in results] == ["alpha done", "beta done", "gamma done"]
    assert [r["status"] for r in results] == ["completed"] * 3
    executions = await turn.tool_executions()
    assert [e.tool_name for e in executions] == ["alpha", "beta", "gamma"]
    child_conversation = await tk.store.load_conversation(children[0].conversation_id)
    assert child_conversation.metadata["parent_turn_id"] == turn.id
    assert child_conversation.metadata["principal"] == "owner"
    assert children[0].options.principal == "owner"


async def test_failed_child_is_a_structured_result(tk: TurnKit) -> None:
    broken = turnkit.Agent("broken", model="scripted", client=ScriptedClient([]))  # exhausted: ModelError
    client = ScriptedClient([call_tools(("broken", {"task": "try"})), "carried on"])
    boss = turnkit.Agent("boss", model="scripted", sub_agents=[broken], client=client)
    turn = await (await tk.conversation(boss)).ask("go")
    assert turn.status == "completed" and turn.output_text == "carried on"
    [result] = last_tool_results(client.requests[1])
    assert result["status"] == "failed" and result["error"]["class"] == "TurnKit::ModelError"


async def test_depth_beyond_max_depth_fails_the_child(tk: TurnKit) -> None:
    leaf = worker_agent("leaf")
    client = ScriptedClient([call_tools(("leaf", {"task": "deep"})), "ok"])
    boss = turnkit.Agent("boss", model="scripted", sub_agents=[leaf], client=client, max_depth=0)
    turn = await (await tk.conversation(boss)).ask("go")
    assert turn.status == "completed"
    [result] = last_tool_results(client.requests[1])
    assert result["status"] == "failed"
    assert result["error"] == {"class": "TurnKit::BudgetError", "message": "maximum sub-agent depth reached"}


async def test_tree_wide_tool_budget_is_shared_exactly(tk: TurnKit) -> None:
    def eager(name: str) -> turnkit.Agent:
        def script(request: turnkit.ModelRequest) -> turnkit.Result:
            if request.messages[-1]["role"] == "tool":
                return turnkit.Result.build(text="done")
            return call_tools(*[("note", {"text": f"{name}{i}"}) for i in range(3)])

        return turnkit.Agent(name, model="scripted", tools=[note], client=ScriptedClient(script))

    client = ScriptedClient([call_tools(("c1", {"task": "x"}), ("c2", {"task": "y"}), ("c3", {"task": "z"})), "ok"])
    boss = turnkit.Agent(
        "boss",
        model="scripted",
        sub_agents=[eager(n) for n in ("c1", "c2", "c3")],
        client=client,
        max_tool_executions=5,
    )
    turn = await (await tk.conversation(boss)).ask("go")
    assert turn.status == "completed"
    executions = await tk.store.list_tool_executions(root_turn_id=turn.id)
    denied = [e for e in executions if (e.error or {}).get("details", {}).get("budget_denied")]
    counted = [e for e in executions if e not in denied and e.status != "cancelled"]
    assert len(counted) == 5  # 3 delegations + 2 tool calls, whatever the interleaving
    assert [e.tool_name for e in counted if e.tool_name == "note"] == ["note", "note"]
    assert denied and all(e.status == "failed" for e in denied)


async def test_launch_agent_with_callback(tk: TurnKit) -> None:
    """T70: ``launch_agent`` with ``callback: true``: the parent completes with "continuing" before its launched
    child ends; once the child completed, the parent conversation's inbox holds 1 delivery and a third model call
    ran."""
    child = worker_agent("helper", seconds=0.2)

    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"] == "start":
            return call_tools(("launch_agent", {"agent_name": "helper", "task": "help", "callback": True}))
        return turnkit.Result.build(text="continuing" if last["role"] == "tool" else "got the callback")

    client = ScriptedClient(script)
    boss = turnkit.Agent("boss", model="scripted", tools=[launch_agent], sub_agents=[child], client=client)
    conversation = await tk.conversation(boss)
    turn = await conversation.ask("start")
    assert turn.status == "completed" and turn.output_text == "continuing"
    [execution] = await turn.tool_executions()
    assert execution.status == "completed" and execution.result is not None
    launched_id = execution.result["turn_id"]
    assert execution.result["status"] in ("pending", "running")

    async def woken() -> bool:
        turns = await conversation.turns()
        return len(turns) == 2 and all(t.record.terminal for t in turns)

    await eventually(woken, what="the callback to wake the parent conversation")
    launched = await tk.store.load_turn(launched_id)
    assert launched.status == "completed" and launched.parent_turn_id == turn.id
    assert turn.record.completed_at and launched.completed_at and turn.record.completed_at < launched.completed_at
    [delivery] = await conversation.inbox()
    assert delivery.key == f"completion:{launched_id}"
    assert client.calls == 3


async def test_wait_for_a_turn_in_another_conversation(tk: TurnKit) -> None:
    """T61: the ``wait_for`` tool on a submitted turn leaves the waiter ``waiting``; once the target ran, the waiter
    completes with 2 model calls and 1 tool execution (the ``wait_for`` call, completed with the target's result)."""
    release, hold = held_tool()

    target_agent = turnkit.Agent(
        "target", model="scripted", tools=[hold], client=ScriptedClient([call_tools(("hold", {})), "target done"])
    )
    target = await (await tk.conversation(target_agent)).ask("work", wait=False)
    waiter_client = ScriptedClient([call_tools(("wait_for", {"turn_ids": [target.id]})), "waited"])
    waiter_agent = turnkit.Agent("waiter", model="scripted", tools=[wait_for], client=waiter_client)
    waiter = await (await tk.conversation(waiter_agent)).ask("wait", wait=False)

    async def waiting() -> bool:
        return len(await _waits(tk, waiter.id)) == 1

    await eventually(waiting, what="the wait edge")
    assert (await waiter.refresh()).status == "waiting"  # blocked in its workflow: no worker slot held
    release.set()
    done = await waiter.result(timeout=60)
    assert done.status == "completed" and done.output_text == "waited"
    [result] = last_tool_results(waiter_client.requests[1])
    assert result["results"][0]["turn_id"] == target.id and result["results"][0]["result"] == "target done"
    assert waiter_client.calls == 2, "T61: 2 model calls"
    [execution] = await done.tool_executions()
    assert (execution.tool_name, execution.status) == ("wait_for", "completed"), "T61: 1 tool execution"
    assert execution.result == result


async def test_wait_rules_and_cycles(tk: TurnKit) -> None:
    release, hold = held_tool()

    def holder(name: str) -> turnkit.Agent:
        return turnkit.Agent(
            name,
            model="scripted",
            tools=[hold, wait_for],
            client=ScriptedClient(
                lambda r: (
                    turnkit.Result.build(text="ok") if r.messages[-1]["role"] == "tool" else call_tools(("hold", {}))
                )
            ),
        )

    a_conv = await tk.conversation(holder("a"))
    b_conv = await tk.conversation(holder("b"))
    a = await a_conv.ask("a", wait=False)
    b = await b_conv.ask("b", wait=False)
    c = await b_conv.ask("c", wait_for=[a], wait=False)  # queued in b's lane behind b; waits on a
    assert len(await _waits(tk, c.id)) == 1
    # a waiting on b would close the cycle a → b's lane (c waits on a) → a.
    with pytest.raises(turnkit.ToolError, match="wait would create a cycle"):
        await a_conv.ask("d", wait_for=[b])
    with pytest.raises(turnkit.ToolError, match="cannot wait for unfinished work in the same conversation"):
        await b_conv.ask("e", wait_for=[b])
    turns_in_a = await a_conv.turns()
    assert len(turns_in_a) == 1  # the rejected submissions wrote nothing (no turn, no message, no wait)
    assert [m.text for m in await a_conv.messages() if m.role == "user"] == ["a"]
    assert [m.text for m in await b_conv.messages() if m.role == "user"] == ["b", "c"]
    release.set()
    done = await c.result(timeout=60)
    assert done.status == "completed"
    messages = [m for m in await b_conv.messages() if m.turn_id == c.id and m.role == "user"]
    assert messages and "wait_results" in messages[0].text


async def test_wait_past_the_root_deadline_times_out(tk: TurnKit) -> None:
    """T57: a turn that waits on another turn past its root deadline (submission + timeout) is ``failed`` with
    "turn timed out"."""
    release, hold = held_tool()

    target_agent = turnkit.Agent(
        "target", model="scripted", tools=[hold], client=ScriptedClient([call_tools(("hold", {})), "late"])
    )
    target = await (await tk.conversation(target_agent)).ask("work", wait=False)
    waiter_agent = turnkit.Agent(
        "waiter",
        model="scripted",
        tools=[wait_for],
        timeout=2,
        client=ScriptedClient([call_tools(("wait_for", {"turn_ids": [target.id]})), "never"]),
    )
    waiter = await (await tk.conversation(waiter_agent)).ask("wait")
    assert waiter.status == "failed"
    assert waiter.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    release.set()
    await target.result(timeout=60)


async def _waits(tk: TurnKit, turn_id: str) -> list[Any]:
    async with tk.store.atomic() as tx:
        return await tx.list_waits(turn_id=turn_id)


async def test_invalid_sub_agent_call_result_keeps_call_order(tk: TurnKit) -> None:
    good = worker_agent("good", seconds=0.05)
    client = ScriptedClient([call_tools(("good", {"task": "fine"}), ("good", {"task": 123})), "both answered"])
    boss = turnkit.Agent("boss", model="scripted", sub_agents=[good], client=client)
    turn = await (await tk.conversation(boss)).ask("go")
    assert turn.status == "completed"
    first, second = last_tool_results(client.requests[1])
    assert first["status"] == "completed" and first["result"] == "good done"
    assert second["error"] is True and "task" in second["message"]


class Finish(turnkit.Tool):
    """End the turn."""

    terminal = "Finished."

    def call(self, context: turnkit.ToolContext, **arguments: Any) -> dict[str, Any]:
        return {}


async def test_a_terminal_tool_before_a_sub_agent_call_creates_no_child(tk: TurnKit) -> None:
    """T69: a terminal tool call followed by a sub-agent call: the parent completes, no child exists, and the last
    execution is ``cancelled``."""
    child = worker_agent("child")
    client = ScriptedClient([call_tools(("finish", {}), ("child", {"task": "never"}))])
    boss = turnkit.Agent("boss", model="scripted", tools=[Finish], sub_agents=[child], client=client)
    turn = await (await tk.conversation(boss)).ask("go")
    assert turn.status == "completed" and turn.output_text == "Finished."
    assert len(await tk.store.list_turns(root_turn_id=turn.id)) == 1
    assert [e.status for e in await turn.tool_executions()] == ["completed", "cancelled"]


async def test_turn_wait_for_before_it_starts(tk: TurnKit) -> None:
    release, hold = held_tool()

    target_agent = turnkit.Agent(
        "target", model="scripted", tools=[hold], client=ScriptedClient([call_tools(("hold", {})), "target out"])
    )
    target = await (await tk.conversation(target_agent)).ask("work", wait=False)
    client = ScriptedClient(["joined"])
    joiner = await tk.conversation(turnkit.Agent("joiner", model="scripted", client=client))
    gated = await joiner.ask("use the result", paused=True)
    await gated.wait_for(target)
    with pytest.raises(turnkit.ToolError, match="a turn cannot wait for itself"):
        await gated.wait_for(gated)
    assert (await gated.resume()).status == "waiting"  # resumed, but its target has not finished
    release.set()
    done = await gated.result(timeout=60)
    assert done.status == "completed" and client.calls == 1
    last = client.requests[0].messages[-1]
    assert last["role"] == "user" and json.loads(last["content"])["wait_results"][0]["result"] == "target out"
    with pytest.raises(turnkit.Error, match="only pending turns can wait"):
        await done.wait_for(target)


async def test_delegation_failing_after_the_first_child_committed_recovers_without_a_duplicate(
    tk: TurnKit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T60: the delegating activity fails right after the first child's transaction committed; its retry (the
    recovery) finds that child and creates the second: the parent completes with 2 children and 2 model calls."""
    original = ChildActivities._delegate_one
    committed: list[str] = []
    failed: list[str] = []

    async def flaky(self: ChildActivities, tx: Any, request: Any, parent: Any, call: Any, asked: Any) -> Any:
        if committed and not failed:  # the first child's transaction is over: fail before the second one
            failed.append(call.id)
            raise RuntimeError("dispatcher died after the first child (injected)")
        result = await original(self, tx, request, parent, call, asked)
        committed.append(call.id)
        return result

    monkeypatch.setattr(ChildActivities, "_delegate_one", flaky)
    subs = [worker_agent(n, seconds=0.05) for n in ("alpha", "beta")]
    client = ScriptedClient([call_tools(("alpha", {"task": "a"}), ("beta", {"task": "b"})), "merged"])
    boss = turnkit.Agent("t60", model="scripted", sub_agents=subs, client=client)
    turn = await (await tk.conversation(boss)).ask("split")
    assert failed, "the injected failure must have happened"
    assert turn.status == "completed" and turn.output_text == "merged"
    children = [t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id]
    assert sorted(c.agent_name for c in children) == ["alpha", "beta"], "T60: 2 children, no duplicate"
    assert all(c.status == "completed" for c in children)
    assert client.calls == 2, "T60: 2 parent model calls"
    assert [e.tool_name for e in await turn.tool_executions()] == ["alpha", "beta"]


async def test_an_implicit_join_writes_wait_edges_that_the_cycle_check_sees(tk: TurnKit) -> None:
    """Behaviour §5.5 implicit sub-agent join (invariant 5): delegating writes the edge parent → child in the
    delegation's transaction, so ``list_waits`` shows the running child and a wait back to the parent's lane, from the
    child or from its conversation, is refused as a cycle; after the join the edge stays, its target terminal."""
    release, hold = held_tool()
    kid = turnkit.Agent("kid", model="scripted", tools=[hold], client=ScriptedClient([call_tools(("hold", {})), "kid"]))
    client = ScriptedClient([call_tools(("kid", {"task": "hold on"})), "joined"])
    boss = turnkit.Agent("boss", model="scripted", sub_agents=[kid], client=client)
    parent = await (await tk.conversation(boss)).ask("delegate", wait=False)

    async def child_holds() -> bool:
        children = [t for t in await tk.store.list_turns(root_turn_id=parent.id) if t.id != parent.id]
        return len(children) == 1 and children[0].status == "running"

    await eventually(child_holds, what="the child turn running")
    [child] = [t for t in await tk.store.list_turns(root_turn_id=parent.id) if t.id != parent.id]
    assert [(w.turn_id, w.target_turn_id) for w in await _waits(tk, parent.id)] == [(parent.id, child.id)]
    assert (await tk.store.load_turn(parent.id)).status == "waiting"
    # The child waiting on its parent closes parent → child → parent: refused, and no edge is left behind.
    with pytest.raises(turnkit.ToolError, match="wait would create a cycle"):
        async with tk.store.atomic(wait_graph=True) as tx:
            await add_waits(tx, child, [parent.id])
    assert await _waits(tk, child.id) == []
    # So is a new turn in the child's conversation (a serial lane) waiting on the parent.
    child_conversation = turnkit.Conversation(tk, await tk.store.load_conversation(child.conversation_id))
    with pytest.raises(turnkit.ToolError, match="wait would create a cycle"):
        await child_conversation.ask("wait for the boss", wait_for=[parent.id])
    release.set()
    done = await parent.result(timeout=60)
    assert done.status == "completed" and done.output_text == "joined"
    # The edge stays (the store has no delete): it is settled because its target is terminal.
    [edge] = await _waits(tk, parent.id)
    assert edge.target_turn_id == child.id and (await tk.store.load_turn(child.id)).terminal
