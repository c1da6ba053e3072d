"""Authorization (spec §7): one hook, asked before every guarded action; one denial test per action."""

from __future__ import annotations

from typing import Any

import pytest

import turnkit
from tests.engine import eventually, held_tool
from turnkit.builtin_tools import launch_agent, send_message, wait_for
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools


class Policy:
    """Denies the listed actions (optionally only for some principals or turns); records every question."""

    def __init__(self, *denied: str, unless_principal: Any = None, deny_turn: str | None = None) -> None:
        self.denied = set(denied)
        self.unless_principal = unless_principal
        self.deny_turn = deny_turn
        self.asked: list[str] = []

    def __call__(self, action: str, *, principal: Any, **resources: Any) -> Any:
        self.asked.append(action)
        if self.deny_turn is not None:
            turn = resources.get("turn")
            return getattr(turn, "id", turn) != self.deny_turn
        if action in self.denied and (self.unless_principal is None or principal != self.unless_principal):
            return "yes"  # truthy but not literally True: still a denial
        return True


invoked: list[str] = []


@turnkit.tool
def secret() -> dict[str, Any]:
    """A guarded tool."""
    invoked.append("secret")
    return {"ok": True}


def agent(name: str = "guarded", script: list[Any] | None = None, **options: Any) -> turnkit.Agent:
    return turnkit.Agent(name, model="scripted", client=ScriptedClient(script or ["ok"]), **options)


def denial(execution: turnkit.ToolExecutionRecord) -> bool:
    details = (execution.error or {}).get("details") or {}
    return execution.status == "failed" and details.get("authorization_denied") is True


async def test_tool_denied_is_a_failed_execution_and_the_turn_goes_on(tk: TurnKit) -> None:
    invoked.clear()
    turnkit.configure(authorize=Policy("tool"))
    turn = await (await tk.conversation(agent(tools=[secret], script=[call_tools(("secret", {})), "fine"]))).ask("x")
    assert turn.status == "completed" and invoked == []
    [execution] = await turn.tool_executions()
    assert denial(execution) and execution.error is not None
    assert execution.error["message"] == "not authorized to tool"


async def test_launch_agent_denied_creates_no_child(tk: TurnKit) -> None:
    child_client = ScriptedClient(["child"])
    child = turnkit.Agent("child", model="scripted", client=child_client)
    turnkit.configure(authorize=Policy("launch_agent"))
    boss = agent(
        "boss",
        sub_agents=[child],
        tools=[launch_agent],
        script=[call_tools(("child", {"task": "t"}), ("launch_agent", {"agent_name": "child", "task": "t"})), "done"],
    )
    turn = await (await tk.conversation(boss)).ask("x")
    assert turn.status == "completed"
    assert all(denial(e) for e in await turn.tool_executions())
    assert len(await tk.store.list_turns(root_turn_id=turn.id)) == 1 and child_client.calls == 0


async def test_wait_denied(tk: TurnKit) -> None:
    target = await (await tk.conversation(agent("target"))).ask("t")
    turnkit.configure(authorize=Policy("wait"))
    waiter = agent("waiter", tools=[wait_for], script=[call_tools(("wait_for", {"turn_ids": [target.id]})), "done"])
    conversation = await tk.conversation(waiter)
    turn = await conversation.ask("x")
    [execution] = await turn.tool_executions()
    assert denial(execution)
    async with tk.store.atomic() as tx:
        assert await tx.list_waits(turn_id=turn.id) == []
    with pytest.raises(turnkit.AuthorizationError, match="not authorized to wait"):
        await conversation.ask("y", wait_for=[target])


async def test_callback_denied_at_submission_and_at_the_end(tk: TurnKit) -> None:
    boss = await tk.conversation(agent("boss"))
    job = await tk.conversation(agent("job", script=["a", "b"]))
    policy = Policy("callback")
    turnkit.configure(authorize=policy)
    with pytest.raises(turnkit.AuthorizationError, match="not authorized to callback"):
        await job.ask("x", callback=boss)
    assert await job.messages() == []  # raised before anything was written
    # Allowed at submission, revoked before the end: the turn completes, the denial is recorded, no delivery.
    turnkit.configure(authorize=None)
    gate, hold = held_tool()

    slow = await tk.conversation(agent("slow", tools=[hold], script=[call_tools(("hold", {})), "finished"]))
    turn = await slow.ask("x", callback=boss, wait=False)
    await eventually(lambda: _running(turn), what="the turn to run")
    turnkit.configure(authorize=Policy("callback"))
    gate.set()
    done = await turn.result(timeout=60)
    assert done.status == "completed"
    assert done.record.options["callback_denied"]["message"] == "not authorized to callback"
    assert await boss.inbox() == []


async def test_send_message_denied(tk: TurnKit) -> None:
    source = await tk.conversation(agent("source"))
    destination = await tk.conversation(agent("destination"))
    turnkit.configure(authorize=Policy("send_message"))
    with pytest.raises(turnkit.AuthorizationError, match="not authorized to send_message"):
        await source.send_message(destination, "hi", key="k1")
    with pytest.raises(turnkit.AuthorizationError):
        await destination.post("hi", key="k2")
    assert await destination.inbox() == []
    talker = agent(
        "talker",
        tools=[send_message],
        script=[call_tools(("send_message", {"conversation_id": destination.id, "text": "x"})), "ok"],
    )
    turn = await (await tk.conversation(talker)).ask("x")
    [execution] = await turn.tool_executions()
    assert denial(execution) and await destination.inbox() == []


@pytest.mark.parametrize("action", ["pause", "resume", "steer", "cancel", "read_control", "read_messages"])
async def test_control_and_read_denials_change_nothing(tk: TurnKit, action: str) -> None:
    conversation = await tk.conversation(agent("owned"), principal="owner")
    turn = await conversation.ask("x", paused=True)
    turnkit.configure(authorize=Policy(action, unless_principal="owner"))
    calls = {
        "pause": lambda who: turn.pause(principal=who),
        "resume": lambda who: turn.resume(principal=who),
        "steer": lambda who: turn.steer("x", key="k", principal=who),
        "cancel": lambda who: turn.cancel(principal=who),
        "read_control": lambda who: turn.control_state(principal=who),
        "read_messages": lambda who: conversation.messages_after(0, principal=who),
    }
    with pytest.raises(turnkit.AuthorizationError, match=f"not authorized to {action}"):
        await calls[action]("other")
    record = (await turn.refresh()).record
    assert record.status == "paused" and record.options["controls"] == {"pause_requested": True, "inputs": []}
    await calls[action]("owner")  # the owner may
    await turn.cancel(principal="owner")


async def test_a_cascade_denied_for_one_child_changes_nothing(tk: TurnKit) -> None:
    gate, hold = held_tool()

    child = turnkit.Agent(
        "kid",
        model="scripted",
        tools=[hold],
        client=ScriptedClient(
            lambda r: call_tools(("hold", {})) if r.messages[-1]["role"] == "user" else turnkit.Result.build(text="k")
        ),
    )
    parent = agent("parent", sub_agents=[child], script=[call_tools(("kid", {"task": "t"})), "p"])
    turn = await (await tk.conversation(parent)).ask("x", wait=False)

    async def child_running() -> bool:
        tree = await tk.store.list_turns(root_turn_id=turn.id)
        return len(tree) == 2 and [t.status for t in tree] == ["waiting", "running"]  # the parent waits on it

    await eventually(child_running, what="the child turn")
    kid = next(t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id)
    turnkit.configure(authorize=Policy(deny_turn=kid.id))
    for control in (turn.pause, turn.cancel):
        with pytest.raises(turnkit.AuthorizationError):
            await control(descendants="cascade")
    with pytest.raises(turnkit.AuthorizationError):
        await turn.steer("x", key="k", descendants="cascade")
    for record in await tk.store.list_turns(root_turn_id=turn.id):
        assert record.status in ("waiting", "running") and "controls" not in record.options
    turnkit.configure(authorize=None)
    gate.set()
    assert (await turn.result(timeout=60)).status == "completed"


async def _running(turn: turnkit.Turn) -> bool:
    return (await turn.refresh()).status == "running"


async def test_an_implicit_join_denied_rolls_back_the_child(tk: TurnKit) -> None:
    child_client = ScriptedClient(["child"])
    child = turnkit.Agent("child", model="scripted", client=child_client)
    policy = Policy("wait")
    turnkit.configure(authorize=policy)
    boss = agent("boss", sub_agents=[child], script=[call_tools(("child", {"task": "t"})), "done"])
    turn = await (await tk.conversation(boss)).ask("x")
    assert turn.status == "completed" and "wait" in policy.asked
    [execution] = await turn.tool_executions()
    assert denial(execution)
    assert len(await tk.store.list_turns(root_turn_id=turn.id)) == 1 and child_client.calls == 0
    # The child conversation rolled back with the child turn (the PostgreSQL database is shared by the session:
    # look for this turn's children only).
    assert [c for c in await _conversations(tk) if c.metadata.get("parent_turn_id") == turn.id] == []


async def _conversations(tk: TurnKit) -> list[turnkit.ConversationRecord]:
    from sqlalchemy import select

    from turnkit.store.schema import ConversationRow

    async with tk.store.atomic() as tx:
        rows = await tx.session.scalars(select(ConversationRow))
        return [await tx.load_conversation(row.uid) for row in rows]
