"""Authorization (behaviour §7): one hook, asked before every guarded action; one denial test per action."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import pytest

import turnkit
from tests.engine import eventually, held_tool
from turnkit._engine.builtin_tools import launch_agent, send_message, wait_for
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
    """T25: a policy that denies ``tool``: the tool is never invoked and its execution is ``failed``
    (``authorization_denied``)."""
    invoked.clear()
    turnkit.configure(authorize=Policy("tool"))
    turn = await (await tk.conversation(agent(tools=[secret], script=[call_tools(("secret", {})), "fine"]))).ask("x")
    assert turn.status == "completed" and invoked == []
    [execution] = await turn.tool_executions()
    assert denial(execution) and execution.error is not None
    assert execution.error["message"] == "not authorized to tool"


async def test_launch_agent_denied_creates_no_child(tk: TurnKit) -> None:
    """T68: ``launch_agent`` denied, for a sub-agent call and for the ``launch_agent`` tool: the run completes, each
    execution failed as denied, no child record exists and the child's client is never called."""
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
    """T73: a callback denied at submission raises ``AuthorizationError`` and writes nothing; one revoked after
    submission leaves the turn ``completed`` with ``options.callback_denied`` set and no delivery."""
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
    assert done.record.options.callback_denied["message"] == "not authorized to callback"
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


async def test_a_deny_all_policy_refuses_send_message_and_perform_later_with_a_callback(tk: TurnKit) -> None:
    """T74: under a deny-all policy, ``send_message`` and a prepared turn's ``perform_later(callback=)`` raise
    ``AuthorizationError``: no delivery exists and the turn stays unsubmitted (no ``submitted_at``)."""
    source = await tk.conversation(agent("source"))
    destination = await tk.conversation(agent("destination"))
    turn = await source.build_turn("x")
    turnkit.configure(authorize=lambda action, **resources: False)
    with pytest.raises(turnkit.AuthorizationError, match="not authorized to send_message"):
        await source.send_message(destination, "hi", key="k1")
    with pytest.raises(turnkit.AuthorizationError, match="not authorized to callback"):
        await turn.perform_later(callback=destination)
    record = (await turn.refresh()).record
    assert record.status == "pending" and record.submitted_at is None
    assert record.options.callback_conversation_id is None
    turnkit.configure(authorize=None)  # the reads below ask read_messages
    assert await source.outbox() == [] and await destination.inbox() == []


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
    assert (
        record.status == "paused"
        and record.options.controls_or_default.pause_requested
        and not record.options.controls_or_default.inputs
    )
    await calls[action]("owner")  # the owner may
    await turn.cancel(principal="owner")


async def test_a_cascade_denied_for_one_child_changes_nothing(tk: TurnKit) -> None:
    """T97: a policy denying controls on the child only: a cascade pause, cancel or steer on the parent raises
    ``AuthorizationError`` and neither the parent's nor the child's status or controls change."""
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
        if len(tree) != 2 or [t.status for t in tree] != ["waiting", "running"]:  # the parent waits on it
            return False
        # Inside its held tool: a tool call not yet authorized when the policy below is set would be denied.
        return [e.status for e in await tk.turn(tree[1].id).tool_executions()] == ["running"]

    await eventually(child_running, what="the child turn inside its held tool")
    kid = next(t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id)
    turnkit.configure(authorize=Policy(deny_turn=kid.id))
    for control in (turn.pause, turn.cancel):
        with pytest.raises(turnkit.AuthorizationError):
            await control(descendants="cascade")
    with pytest.raises(turnkit.AuthorizationError):
        await turn.steer("x", key="k", descendants="cascade")
    for record in await tk.store.list_turns(root_turn_id=turn.id):
        assert record.status in ("waiting", "running") and record.options.controls is None
    turnkit.configure(authorize=None)
    gate.set()
    assert (await turn.result(timeout=60)).status == "completed"


async def _running(turn: turnkit.Turn) -> bool:
    return (await turn.refresh()).status == "running"


async def test_an_implicit_join_denied_rolls_back_the_child(tk: TurnKit) -> None:
    """T67: ``wait`` denied when a parent delegates to a sub-agent: ``wait`` was asked, the execution failed as
    denied, and neither a wait nor a child (turn or conversation) exists."""
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
    async with tk.store.atomic() as tx:
        assert await tx.list_waits(turn_id=turn.id) == []  # the edge rolled back with the child
    # The child conversation rolled back with the child turn (the PostgreSQL database is shared by the session:
    # look for this turn's children only).
    assert [c for c in await _conversations(tk) if c.metadata.get("parent_turn_id") == turn.id] == []


async def _conversations(tk: TurnKit) -> list[turnkit.ConversationRecord]:
    from sqlalchemy import select

    from turnkit.store.schema import ConversationRow

    async with tk.store.atomic() as tx:
        uids = await tx.connection.scalars(select(ConversationRow.uid))
        return [await tx.load_conversation(uid) for uid in uids]


# issue 8 items 2, 9, 10: a raising hook is a denial; sync and async hooks, off the loop, outside transactions;
# ``tool`` asked for every tool call. -------------------------------------------------------------------------------


class ApprovalServiceDown(Exception):
    """What a hook that calls an unreachable approval service raises."""


class Raising:
    """Raises on one action (allows everything else, and the same action at submission, where ``turn`` is None)."""

    def __init__(self, action: str) -> None:
        self.action = action
        self.raised = 0

    def __call__(self, action: str, *, principal: Any, **resources: Any) -> Any:
        if action == self.action and not ("turn" in resources and resources["turn"] is None):
            self.raised += 1
            raise ApprovalServiceDown("approval service unreachable")
        return True


def hook_denial(execution: turnkit.ToolExecutionRecord, action: str) -> bool:
    """A denial recorded with the hook's exception class (behaviour §7.4 details, plus ``hook_error``)."""
    details = (execution.error or {}).get("details") or {}
    return (
        denial(execution)
        and details.get("class") == "TurnKit::AuthorizationError"
        and details.get("hook_error") == "ApprovalServiceDown"
        and (execution.error or {}).get("message") == f"not authorized to {action}"
    )


@pytest.mark.parametrize(
    "site", ["tool", "send_message", "delegate", "implicit_join", "launch_agent", "launch_callback", "wait_for"]
)
async def test_a_raising_hook_denies_the_call_and_the_turn_goes_on(
    tk: TurnKit, site: str, caplog: pytest.LogCaptureFixture
) -> None:
    """issue 8 item 2: the hook raises inside a tool, a delegation or a wait: that call is denied with the
    exception's class, nothing it guards happens, no store activity retries, the turn finishes (2 model calls)."""
    invoked.clear()
    child_client = ScriptedClient(["child"])
    child = turnkit.Agent("child", model="scripted", client=child_client)
    target = await (await tk.conversation(agent("target"))).ask("t")
    destination = await tk.conversation(agent("destination"))
    calls = {
        "tool": ("secret", {}),
        "send_message": ("send_message", {"conversation_id": destination.id, "text": "x"}),
        "delegate": ("child", {"task": "t"}),
        "implicit_join": ("child", {"task": "t"}),
        "launch_agent": ("launch_agent", {"agent_name": "child", "task": "t"}),
        "launch_callback": ("launch_agent", {"agent_name": "child", "task": "t", "callback": True}),
        "wait_for": ("wait_for", {"turn_ids": [target.id]}),
    }
    actions = {"delegate": "launch_agent", "implicit_join": "wait", "launch_callback": "callback", "wait_for": "wait"}
    action = actions.get(site, site)
    hook = Raising(action)
    turnkit.configure(authorize=hook)
    client = ScriptedClient([call_tools(calls[site]), "went on"])
    tools = [secret, send_message, launch_agent, wait_for]
    worker = turnkit.Agent("worker", model="scripted", client=client, tools=tools, sub_agents=[child])
    with caplog.at_level("WARNING", logger="turnkit._engine.authorization"):
        turn = await (await (await tk.conversation(worker)).ask("x", wait=False)).result(timeout=60)
    assert turn.status == "completed" and turn.output_text == "went on"
    assert client.calls == 2 and hook.raised == 1  # asked once: no activity retried because of the hook
    [execution] = await turn.tool_executions()
    assert hook_denial(execution, action), execution.error
    assert invoked == [] and child_client.calls == 0 and await destination.inbox() == []
    assert len(await tk.store.list_turns(root_turn_id=turn.id)) == 1  # no child (the join's rolled back too)
    async with tk.store.atomic() as tx:
        assert await tx.list_waits(turn_id=turn.id) == []
    [logged] = [r for r in caplog.records if r.name == "turnkit._engine.authorization"]
    assert logged.exc_info is not None and isinstance(logged.exc_info[1], ApprovalServiceDown)


async def test_a_raising_callback_hook_keeps_the_final_answer(tk: TurnKit, caplog: pytest.LogCaptureFixture) -> None:
    """issue 8 item 2: the completion callback's hook raises at the terminal write: the answer stands (the model is
    called once), ``callback_denied`` records the exception's class and no delivery is made."""
    boss = await tk.conversation(agent("boss"))
    client = ScriptedClient(["final answer"])
    job = await tk.conversation(turnkit.Agent("job", model="scripted", client=client))
    hook = Raising("callback")
    turnkit.configure(authorize=hook)
    with caplog.at_level("WARNING", logger="turnkit._engine.authorization"):
        turn = await (await job.ask("x", callback=boss, wait=False)).result(timeout=60)
    assert turn.status == "completed" and turn.output_text == "final answer"
    assert client.calls == 1 and hook.raised == 1
    denied = turn.record.options.callback_denied
    assert denied["class"] == "TurnKit::AuthorizationError" and denied["message"] == "not authorized to callback"
    assert denied["hook_error"] == "ApprovalServiceDown"
    assert await boss.inbox() == [] and await job.outbox() == []
    assert any(r.name == "turnkit._engine.authorization" and r.exc_info for r in caplog.records)


async def test_a_raising_hook_on_a_client_call_raises_authorization_error(tk: TurnKit) -> None:
    """issue 8 item 2: client-side, a hook that raises is an ``AuthorizationError`` caused by the exception."""
    conversation = await tk.conversation(agent("owned"))
    turnkit.configure(authorize=Raising("read_messages"))
    with pytest.raises(turnkit.AuthorizationError, match="not authorized to read_messages") as raised:
        await conversation.messages_after(0)
    assert isinstance(raised.value.__cause__, ApprovalServiceDown)


class AsyncPolicy:
    """An object whose ``.authorize`` is ``async def``: denies ``tool`` for the principal "intern"."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def authorize(self, action: str, *, principal: Any, **resources: Any) -> bool:
        self.asked.append(action)
        await asyncio.sleep(0)  # really asynchronous
        return not (action == "tool" and principal == "intern")


async def test_async_hooks_allow_and_deny(tk: TurnKit) -> None:
    """issue 8 item 9: an ``async def`` hook (a function, or an object's method) is awaited: its True allows."""
    invoked.clear()
    policy = AsyncPolicy()
    turnkit.configure(authorize=policy)
    script = [call_tools(("secret", {})), "ok"]
    allowed = await (await tk.conversation(agent(tools=[secret], script=script), principal="boss")).ask("x")
    [execution] = await allowed.tool_executions()
    assert execution.status == "completed" and invoked == ["secret"] and "tool" in policy.asked
    denied = await (await tk.conversation(agent(tools=[secret], script=script), principal="intern")).ask("x")
    [execution] = await denied.tool_executions()
    assert denial(execution) and invoked == ["secret"]

    async def deny_reads(action: str, *, principal: Any, **resources: Any) -> bool:
        return action != "read_control"

    turnkit.configure(authorize=deny_reads)
    with pytest.raises(turnkit.AuthorizationError, match="not authorized to read_control"):
        await allowed.control_state()


async def test_a_slow_sync_hook_does_not_stall_another_turns_tool(tk: TurnKit) -> None:
    """issue 8 item 9: a sync hook that blocks 9 s (a slow approval service) while an at-most-once tool of another
    turn runs with a 4 s heartbeat timeout: that tool keeps heartbeating and completes; the slow call is allowed.
    The SDK sends a heartbeat at most every 0.8 timeouts, so a beat has 0.8 s to reach the server (at 1 s, 0.2 s:
    the twin test of event callbacks missed a beat on a loaded machine at 2 s)."""
    turnkit.configure(tool_heartbeat_timeout=4.0)
    approving, approved = threading.Event(), threading.Event()

    def slow_approval(action: str, *, principal: Any, **resources: Any) -> bool:
        tool = resources.get("tool")
        if action == "tool" and getattr(tool, "name", None) == "approve_me":
            approving.set()
            time.sleep(9)  # blocks whatever thread it runs on
            approved.set()
        return True

    steady_entered, second_done = asyncio.Event(), asyncio.Event()

    @turnkit.tool
    async def steady() -> dict[str, Any]:
        """At most once; runs until the other turn is over (its activity must heartbeat all along)."""
        steady_entered.set()
        await second_done.wait()
        return {"steady": True}

    @turnkit.tool
    def approve_me() -> dict[str, Any]:
        """Needs a slow approval."""
        return {"approved": True}

    turnkit.configure(authorize=slow_approval)
    first = agent("first", tools=[steady], script=[call_tools(("steady", {})), "first done"])
    second = agent("second", tools=[approve_me], script=[call_tools(("approve_me", {})), "second done"])
    healthy = await (await tk.conversation(first)).ask("x", wait=False)
    await asyncio.wait_for(steady_entered.wait(), 30)
    slow = await (await tk.conversation(second)).ask("x", wait=False)
    slow = await slow.result(timeout=60)
    second_done.set()
    healthy = await healthy.result(timeout=60)
    assert approving.is_set() and approved.is_set()
    [approved_run] = await slow.tool_executions()
    assert approved_run.status == "completed", (approved_run.status, approved_run.error)
    [steady_run] = await healthy.tool_executions()
    assert steady_run.status == "completed", (steady_run.status, steady_run.error)
    assert slow.status == healthy.status == "completed"


async def test_t92_cascade_pause_during_a_blocked_launch_agent_authorisation(tk: TurnKit) -> None:
    """T92 (issue 8 item 9): the launch_agent approval blocks; a cascade pause lands meanwhile; released, the
    parent is paused with no child (the boundary is re-checked after the hook); resumed, it completes with 1 child."""
    entered, release = threading.Event(), threading.Event()
    asked: list[str] = []

    def approval_service(action: str, *, principal: Any, **resources: Any) -> bool:
        asked.append(action)
        if action == "launch_agent" and asked.count("launch_agent") == 1:
            entered.set()
            return release.wait(60)  # the first approval waits for a human
        return True

    child_client = ScriptedClient(["child done"])
    child = turnkit.Agent("child", model="scripted", client=child_client)
    turnkit.configure(authorize=approval_service)
    parent = agent("parent", sub_agents=[child], script=[call_tools(("child", {"task": "t"})), "parent done"])
    turn = await (await tk.conversation(parent)).ask("x", wait=False)
    assert await asyncio.to_thread(entered.wait, 30), "the launch_agent approval was never asked"
    await turn.pause(descendants="cascade")  # the hook is not holding any lock: the pause goes through
    release.set()

    async def paused() -> bool:
        return (await turn.refresh()).status == "paused"

    await eventually(paused, what="the parent to pause at the boundary after the approval")
    assert [t.id for t in await tk.store.list_turns(root_turn_id=turn.id)] == [turn.id]  # no child
    assert child_client.calls == 0
    await turn.resume(descendants="cascade")
    done = await turn.result(timeout=60)
    assert done.status == "completed" and done.output_text == "parent done"
    tree = await tk.store.list_turns(root_turn_id=turn.id)
    assert len(tree) == 2 and child_client.calls == 1  # exactly 1 child
    assert asked.count("launch_agent") == 2  # asked again on resume


async def test_a_principal_that_may_use_no_tool_cannot_message_delegate_launch_or_wait(tk: TurnKit) -> None:
    """issue 8 item 10: ``tool`` is asked for every tool call, coordination tools and sub-agent calls included,
    before the specific action: a principal denied ``tool`` sends nothing, creates no child and waits on nothing."""
    invoked.clear()
    child_client = ScriptedClient(["child"])
    child = turnkit.Agent("child", model="scripted", client=child_client)
    target = await (await tk.conversation(agent("target"))).ask("t")
    destination = await tk.conversation(agent("destination"))
    policy = Policy("tool", unless_principal="admin")
    turnkit.configure(authorize=policy)
    proposals = call_tools(
        ("child", {"task": "t"}),
        ("launch_agent", {"agent_name": "child", "task": "t"}),
        ("send_message", {"conversation_id": destination.id, "text": "x"}),
        ("wait_for", {"turn_ids": [target.id]}),
        ("secret", {}),
    )
    client = ScriptedClient([proposals, "nothing allowed"])
    tools = [secret, send_message, launch_agent, wait_for]
    intern = turnkit.Agent("intern", model="scripted", client=client, tools=tools, sub_agents=[child])
    turn = await (await tk.conversation(intern, principal="intern")).ask("x")
    assert turn.status == "completed" and client.calls == 2
    executions = await turn.tool_executions()
    assert sorted(e.tool_name for e in executions) == ["child", "launch_agent", "secret", "send_message", "wait_for"]
    for execution in executions:
        assert denial(execution) and (execution.error or {}).get("message") == "not authorized to tool", execution
    # Denied first: the specific actions are never asked (this test's own reads ask read_messages).
    assert set(policy.asked) - {"read_messages"} == {"tool"}, policy.asked
    assert len(await tk.store.list_turns(root_turn_id=turn.id)) == 1 and child_client.calls == 0
    assert await destination.inbox() == [] and invoked == []
    async with tk.store.atomic() as tx:
        assert await tx.list_waits(turn_id=turn.id) == []


async def test_a_hook_that_never_answers_is_a_denial_within_the_calls_time(tk: TurnKit) -> None:
    """issue 8 items 2, 9: the ``tool`` question gets what is left of the tool activity's time (4 s here); a hook
    still thinking then is a denial with ``TimeoutError``, asked once: the activity is not timed out and retried."""
    never = threading.Event()
    asked: list[str] = []

    def stuck(action: str, *, principal: Any, **resources: Any) -> bool:
        asked.append(action)
        return never.wait(30)  # an approval service that never answers

    @turnkit.tool(timeout=4)
    def guarded() -> dict[str, Any]:
        """Guarded by a stuck approval service."""
        return {"ran": True}

    turnkit.configure(authorize=stuck)
    client = ScriptedClient([call_tools(("guarded", {})), "denied in time"])
    conversation = await tk.conversation(turnkit.Agent("stuck", model="scripted", client=client, tools=[guarded]))
    try:
        turn = await conversation.ask("x")
    finally:
        never.set()
    assert turn.status == "completed" and client.calls == 2 and asked == ["tool"]
    [execution] = await turn.tool_executions()
    assert denial(execution) and (execution.error or {})["details"]["hook_error"] == "TimeoutError", execution.error


class Recorder:
    """Allows everything but ``denied`` actions, which only ``owner`` may take; records each question's resources."""

    def __init__(self, *denied: str, owner: Any = "owner") -> None:
        self.denied = set(denied)
        self.owner = owner
        self.asked: list[tuple[str, Any, dict[str, Any]]] = []

    def __call__(self, action: str, *, principal: Any, **resources: Any) -> bool:
        self.asked.append((action, principal, resources))
        return action not in self.denied or principal == self.owner


async def test_standalone_paint_and_view_media_ask_the_hook_for_the_turns_principal(tk: TurnKit) -> None:
    """§7.3 ``paint`` / ``view_media``: a prepared turn's standalone call asks the hook for the turn's stored
    principal (with the turn and the call's inputs) before anything is claimed or paid. Denied: it raises
    ``AuthorizationError`` and no provider is called; the owner's call goes through."""
    from turnkit.media import MediaInput
    from turnkit.testing import image

    png = b"\x89PNG\r\n\x1a\nIHDR" + uuid.uuid4().bytes
    hook = Recorder("paint", "view_media")
    turnkit.configure(authorize=hook)
    for who in ("mallory", "owner"):
        client = ScriptedClient(["a cat"], images=[image(png)])
        studio = turnkit.Agent(f"studio_{who}", model="scripted", client=client)
        conversation = await tk.conversation(studio, principal=who)
        painting, viewing = await conversation.build_turn("paint"), await conversation.build_turn("look")
        if who == "mallory":
            with pytest.raises(turnkit.AuthorizationError, match=r"^not authorized to paint$"):
                await painting.paint("a cat", model="scripted-image")
            with pytest.raises(turnkit.AuthorizationError, match=r"^not authorized to view_media$"):
                await viewing.view_media(MediaInput.bytes(png), objective="what?")
            assert client.paint_requests == [] and client.calls == 0, "a denied call must pay nobody"
            assert [m.kind for m in await conversation.messages()] == ["text", "text"]  # the two prompts only
        else:
            assert (await painting.paint("a cat", model="scripted-image")).status == "completed"
            assert (await viewing.view_media(MediaInput.bytes(png), objective="what?")).output_text == "a cat"
        asked = [(action, principal, resources) for action, principal, resources in hook.asked if action in hook.denied]
        (paint, paint_by, paint_resources), (view, view_by, view_resources) = asked[-2:]
        assert (paint, paint_by, view, view_by) == ("paint", who, "view_media", who)
        assert paint_resources["turn"].id == painting.id and paint_resources["prompt"] == "a cat"
        assert paint_resources["model"] == "scripted-image"
        assert view_resources["turn"].id == viewing.id and view_resources["objective"] == "what?"


async def test_every_read_api_asks_read_messages(tk: TurnKit) -> None:
    """§7.3 ``read_messages``: every read of a conversation's content (``messages``, ``messages_after``, ``turns``,
    ``inbox``, ``outbox``, ``Turn.messages``, ``Turn.tool_executions``, ``Turn.preview``, a run's ``messages`` and
    ``tool_executions``) asks what ``messages_after`` asks, for
    the caller's principal, naming the conversation (and the turn for a turn's reads); a denial raises."""
    conversation = await tk.conversation(
        agent("reader", tools=[secret], script=[call_tools(("secret", {})), "done"]), principal="owner"
    )
    turn = await conversation.ask("go")
    prepared = await conversation.build_turn("next")
    run = await tk.run(agent("runner"), "go")
    hook = Recorder("read_messages")
    turnkit.configure(authorize=hook)
    reads: dict[str, Any] = {
        "messages": lambda who: conversation.messages(principal=who),
        "messages_after": lambda who: conversation.messages_after(0, principal=who),
        "turns": lambda who: conversation.turns(principal=who),
        "inbox": lambda who: conversation.inbox(principal=who),
        "outbox": lambda who: conversation.outbox(principal=who),
        "Turn.messages": lambda who: turn.messages(principal=who),
        "Turn.tool_executions": lambda who: turn.tool_executions(principal=who),
        "Turn.preview": lambda who: prepared.preview(principal=who),
        "Run.messages": lambda who: run.messages(principal=who),
        "Run.tool_executions": lambda who: run.tool_executions(principal=who),
    }
    for name, read in reads.items():
        with pytest.raises(turnkit.AuthorizationError, match=r"^not authorized to read_messages$"):
            await read("other")
        await read("owner")
        action, principal, resources = hook.asked[-1]
        assert (action, principal) == ("read_messages", "owner"), name
        mine = run.record.conversation_id if name.startswith("Run.") else conversation.id
        assert resources["destination_conversation"] == mine, name
        if name.startswith("Turn."):
            assert resources["turn"].id == (prepared.id if name == "Turn.preview" else turn.id), name
    assert len(await turn.tool_executions(principal="owner")) == 1


async def test_a_tools_deliver_asks_send_message_for_the_turns_principal(tk: TurnKit) -> None:
    """§7.3 ``send_message`` from a tool's context (``context.store.deliver``): asked for the turn's principal; denied,
    the call fails as a denied one (``authorization_denied``), no delivery exists, and the turn goes on."""
    destination = await tk.conversation(agent("delivery_target"))

    @turnkit.tool
    async def notify(context: turnkit.ToolContext) -> dict[str, Any]:
        """Tell the other conversation."""
        assert context.store is not None
        delivery = await context.store.deliver(destination.id, "news", key="news")
        return {"delivery": delivery.id}

    hook = Recorder("send_message")
    turnkit.configure(authorize=hook)
    for who in ("intern", "owner"):
        client = ScriptedClient([call_tools(("notify", {})), "told"])
        notifier = turnkit.Agent(f"notifier_{who}", model="scripted", client=client, tools=[notify])
        turn = await (await tk.conversation(notifier, principal=who)).ask("x")
        assert turn.status == "completed" and client.calls == 2
        [execution] = await turn.tool_executions()
        asked = [(principal, resources) for action, principal, resources in hook.asked if action == "send_message"]
        assert asked[-1] == (
            who,
            {"source_conversation": turn.record.conversation_id, "destination_conversation": destination.id},
        )
        if who == "intern":
            assert denial(execution) and (execution.error or {})["message"] == "not authorized to send_message"
            assert await destination.inbox() == []
        else:
            [delivery] = await destination.inbox()
            assert execution.status == "completed" and execution.result == {"delivery": delivery.id}
