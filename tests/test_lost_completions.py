"""Lost activity completions (issue 8 item 4): an attempt that committed but whose completion never reached
Temporal is retried, and the retry returns what the first attempt created, so nothing is orphaned or repeated.

The fault is real: a worker interceptor lets each activity's body run and commit, then fails the first attempt as a
worker killed after the commit (or a start-to-close expiring during it) would. Temporal retries it.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

import turnkit
from tests.engine import Engine, eventually
from turnkit._engine.builtin_tools import launch_agent, wait_for
from turnkit.testing import ScriptedClient, call_tools


class LoseFirstCompletion(Interceptor):
    """Fails the first attempt of every activity (of the given types) after its body returned."""

    def __init__(self, types: set[str] | None = None) -> None:
        self.types = types
        self.lost: Counter[str] = Counter()

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _LoseFirst(next, self)


class _LoseFirst(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, owner: LoseFirstCompletion) -> None:
        super().__init__(next)
        self.owner = owner

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await self.next.execute_activity(input)
        info = activity.info()
        kind = "tool" if info.activity_type.startswith("tool:") else info.activity_type
        if info.attempt == 1 and (self.owner.types is None or kind in self.owner.types):
            self.owner.lost[kind] += 1
            raise RuntimeError(f"completion of {info.activity_type} lost after its commit (test fault)")
        return result


effects: Counter[str] = Counter()


@turnkit.tool
def charge_card(amount: int) -> dict[str, Any]:
    """Charge the card (at most once)."""
    effects["charge_card"] += 1
    return {"charged": amount}


@turnkit.tool(recovery="replay_safe")
def lookup(q: str) -> dict[str, Any]:
    """Look something up (safe to repeat)."""
    effects["lookup"] += 1
    return {"answer": q.upper()}


@pytest.mark.usefixtures("through_lanes")
async def test_every_activity_losing_its_first_completion_orphans_nothing(engine: Engine) -> None:
    """Issue 8 item 4: every activity's first completion is lost: the tree still completes, the delegated and the
    launched child run, the posted message wakes a turn, and no tool or model call is repeated."""
    effects.clear()

    def wait_for_launched(request: turnkit.ModelRequest) -> turnkit.Result:
        launched = json.loads(request.messages[-1]["content"])["turn_id"]
        return call_tools(("wait_for", {"turn_ids": [launched]}))

    helper_client = ScriptedClient(lambda request: turnkit.Result.build(text="helped"))
    helper = turnkit.Agent("helper", model="scripted", client=helper_client)
    boss_client = ScriptedClient(
        [
            call_tools(("helper", {"task": "delegated"})),
            call_tools(("launch_agent", {"agent_name": "helper", "task": "launched"})),
            wait_for_launched,
            call_tools(("charge_card", {"amount": 5}), ("lookup", {"q": "a"})),
            "boss done",
            "woken done",
        ]
    )
    boss = turnkit.Agent(
        "boss",
        model="scripted",
        tools=[launch_agent, wait_for, charge_card, lookup],
        sub_agents=[helper],
        client=boss_client,
    )
    lose = LoseFirstCompletion()
    async with engine.tk.worker(interceptors=[lose]):
        conversation = await engine.tk.conversation(boss)
        turn = await conversation.ask("go")
        assert turn.status == "completed", turn.error
        assert turn.output_text == "boss done"

        await conversation.post("more", key="more-1")

        async def woken() -> bool:
            turns = await conversation.turns()
            return len(turns) == 2 and all(t.record.terminal for t in turns)

        await eventually(woken, timeout=60, what="the posted message to wake a turn that completes")
        second = (await conversation.turns())[1]
        assert second.record.status == "completed" and second.record.output_text == "woken done"

        executions = {e.tool_name: e for e in await turn.tool_executions()}
        launched_id = executions["launch_agent"].result["turn_id"]  # type: ignore[index]

        async def launched_done() -> bool:
            return (await engine.tk.store.load_turn(launched_id)).terminal

        await eventually(launched_done, timeout=60, what="the launched child to run")
        assert (await engine.tk.store.load_turn(launched_id)).status == "completed"

    kinds = ("submit_turn", "model", "delegate", "join", "wait", "finish_wait", "settle_tool", "deliver")
    for kind in (f"turnkit.{k}" for k in kinds):
        assert lose.lost[kind] >= 1, f"no completion of {kind} was lost: the fault was not injected"
    assert lose.lost["tool"] == 2
    assert {name: e.status for name, e in executions.items()} == {
        "helper": "completed",
        "launch_agent": "completed",
        "wait_for": "completed",
        "charge_card": "completed",  # its result was committed before the completion was lost: recorded, not lost
        "lookup": "completed",
    }
    assert executions["helper"].result is not None and executions["helper"].result["status"] == "completed"
    assert effects == {"charge_card": 1, "lookup": 1}  # nothing ran twice
    [waited] = executions["wait_for"].result["results"]  # type: ignore[index]
    assert (waited["turn_id"], waited["status"]) == (launched_id, "completed")  # it waited for the launched child
    assert boss_client.calls == 6  # five model calls for the turn, one for the woken turn: no response re-requested
    assert helper_client.calls == 2  # the delegated child and the launched child, once each


class FailBeforeBody(Interceptor):
    """Fails every attempt of one activity type before its body runs: an infrastructure failure, not the tool."""

    def __init__(self, activity_type: str) -> None:
        self.activity_type = activity_type

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        owner = self

        class Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                if activity.info().activity_type == owner.activity_type:
                    raise ConnectionResetError("connection to the store lost (test fault)")
                return await self.next.execute_activity(input)

        return Inbound(next)


@turnkit.tool
def refuse(amount: int) -> dict[str, Any]:
    """Always raises (at most once)."""
    effects["refuse"] += 1
    raise ValueError(f"card declined: {amount}")


async def test_at_most_once_attempt_failing_outside_the_tool_is_interrupted(engine: Engine) -> None:
    """Issue 8 item 3: only the tool raising makes an at-most-once call `failed`; an attempt that failed for any
    other reason (here the infrastructure, before or after the body) has an unknown outcome: `interrupted`."""
    effects.clear()
    client = ScriptedClient([call_tools(("charge_card", {"amount": 1}), ("refuse", {"amount": 2})), "done"])
    agent = turnkit.Agent("charger", model="scripted", tools=[charge_card, refuse], client=client)
    async with engine.tk.worker(interceptors=[FailBeforeBody("tool:charge_card")]):
        turn = await (await engine.tk.conversation(agent)).ask("charge")
    assert turn.status == "completed", turn.error
    executions = {e.tool_name: e for e in await turn.tool_executions()}
    assert executions["charge_card"].status == "interrupted"  # not "failed" with the connection error
    assert executions["refuse"].status == "failed"  # the tool raised: its outcome is known
    assert executions["refuse"].error is not None
    assert executions["refuse"].error["message"] == "ValueError: card declined: 2"
    assert effects == {"refuse": 1}


class LocalAttemptFault(Interceptor):
    """Fails the *local* attempt of one activity type (patch local-store-calls): before its body runs (the store is
    away) or after its body committed (its completion is lost). The call's fallback activity runs it again."""

    def __init__(self, activity_type: str, *, after_body: bool) -> None:
        self.activity_type = activity_type
        self.after_body = after_body
        self.failed = 0

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        owner = self

        class Inbound(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                info = activity.info()
                hit = info.is_local and info.activity_type == owner.activity_type
                if hit and not owner.after_body:
                    owner.failed += 1
                    raise ConnectionRefusedError("the store is away (test fault)")
                result = await self.next.execute_activity(input)
                if hit:
                    owner.failed += 1
                    raise RuntimeError(f"completion of local {info.activity_type} lost after its commit (test fault)")
                return result

        return Inbound(next)


async def test_a_wake_whose_local_attempt_lost_its_completion_runs_the_turn_it_created(engine: Engine) -> None:
    """Issue 9 (patch local-store-calls): the local attempt of ``turnkit.deliver`` commits the delivery and the woken
    turn, then fails; its fallback activity finds that turn (the lane chose its id) and the lane runs it, so the
    posted message is answered once and no pending turn is orphaned."""
    client = ScriptedClient(["woken done"])
    agent = turnkit.Agent("inbox", model="scripted", client=client)
    lose = LocalAttemptFault("turnkit.deliver", after_body=True)
    async with engine.tk.worker(interceptors=[lose]):
        conversation = await engine.tk.conversation(agent)
        await conversation.post("wake up", key="wake-1")

        async def settled() -> bool:
            turns = await conversation.turns()
            return bool(turns) and all(t.record.terminal for t in turns)

        await eventually(settled, timeout=60, what="the woken turn to end")
    assert lose.failed >= 1, "no local completion of turnkit.deliver was lost: the fault was not injected"
    [turn] = await conversation.turns()
    assert (turn.record.status, turn.record.output_text) == ("completed", "woken done")
    assert client.calls == 1
