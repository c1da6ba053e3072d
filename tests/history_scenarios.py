"""Deterministic scenarios whose Temporal histories are recorded (``make histories``) and replayed (test_replay).

Every scenario runs on a :class:`~turnkit.runtime.TurnKit` handle with a worker running, with a scripted model, and
returns the ids of the workflows whose histories are worth keeping. ``TurnWorkflow`` reads each tool's retry policy
from the agent registry, also while replaying, so the agents live here: the recorder and the replay test register the
same definitions (:func:`register_scenario_agents`).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

import turnkit
from tests.engine import eventually, stored_pending_turn
from tests.team_app import ApprovalWorkflow
from turnkit._engine.builtin_tools import launch_agent, wait_for
from turnkit._engine.client_requests import cancel_workflow_id
from turnkit._workflows.lane import ConversationWorkflow
from turnkit.agent import Agent, register, resolve_agent
from turnkit.config import configure, settings
from turnkit.kernel.errors import TransientModelError
from turnkit.kernel.payloads import LaneInput
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, ScriptItem, call_tools, image
from turnkit.tools import Tool, ToolContext

__all__ = [
    "SCENARIOS",
    "TEAM_WORKFLOWS",
    "Recorded",
    "answer_audit",
    "client_requests",
    "delivery_wake",
    "direct_first_turn",
    "history_prefix",
    "lane_busy_rollover",
    "lane_two_turns",
    "launch_callback",
    "pause_past_deadline",
    "pause_resume",
    "register_scenario_agents",
    "scenario_agent",
    "steer",
    "subagent_fanout",
    "team_approval",
    "terminal_answer_audit",
    "turn_budget",
    "turn_local_model",
    "turn_terminal_tool",
    "turn_tool_failures",
    "turn_tools",
    "wait_for_turn",
    "workflow_id",
]

#: One history a scenario keeps: a workflow id, or ``(label, workflow id)`` when it keeps more than one history of one
#: workflow type (the label goes into the file name: ``<scenario>-<label>-<WorkflowType>-v<N>.json``).
Recorded = str | tuple[str, str]
Scenario = Callable[[TurnKit], Awaitable[list[Recorded]]]


def workflow_id(entry: Recorded) -> str:
    """The workflow id of a scenario's result entry."""
    return entry[1] if isinstance(entry, tuple) else entry


def history_prefix(scenario: str, entry: Recorded) -> str:
    """The file name prefix of a recorded history: the scenario name, plus the entry's label if any."""
    return f"{scenario}-{entry[0]}" if isinstance(entry, tuple) else scenario


# -- tools ------------------------------------------------------------------------------------------------------------


@turnkit.tool(recovery="replay_safe")
def lookup(q: str) -> dict[str, Any]:
    """Look something up.

    Args:
        q: The query.
    """
    return {"answer": q.upper()}


@turnkit.tool
def notify(message: str) -> dict[str, Any]:
    """Send a notification (at most once).

    Args:
        message: What to send.
    """
    return {"sent": message}


@turnkit.tool
def boom(reason: str) -> dict[str, Any]:
    """Always fails with a ToolError.

    Args:
        reason: Why.
    """
    raise turnkit.ToolError(f"boom: {reason}")


@turnkit.tool(name="lookup_local", recovery="replay_safe", local=True)
def lookup_local(q: str) -> dict[str, Any]:
    """Look something up, as a local activity.

    Args:
        q: The query.
    """
    return {"answer": q.upper()}


@turnkit.tool(name="notify_local", local=True)
def notify_local(message: str) -> dict[str, Any]:
    """Send a notification (at most once), as a local activity.

    Args:
        message: What to send.
    """
    return {"sent": message}


@turnkit.tool(name="flaky_local", recovery="replay_safe", local=True, initial_retry_interval=0.1)
def flaky_local(q: str, context: turnkit.ToolContext) -> dict[str, Any]:
    """Look something up; the first (local) attempt fails, the regular activity's attempt succeeds.

    Args:
        q: The query.
    """
    if context.attempt == 1:
        raise ConnectionError("the first attempt lost its connection")
    return {"answer": q.upper(), "attempt": context.attempt}


class Gate:
    """Holds a :func:`hold` call until the scenario opens it; ``entered`` is set once the call is inside."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.opened = asyncio.Event()

    async def wait_entered(self, timeout: float = 30.0) -> None:
        await asyncio.wait_for(self.entered.wait(), timeout)


#: Gate name -> gate, set up by the scenario before its turn calls ``hold(gate=<name>)``.
_GATES: dict[str, Gate] = {}


def _gate(name: str) -> Gate:
    """A fresh gate (scenarios may run more than once per process)."""
    gate = _GATES[name] = Gate()
    return gate


@turnkit.tool
async def hold(gate: str) -> dict[str, Any]:
    """Block until the scenario opens the gate: makes a turn busy for as long as a scenario needs.

    Args:
        gate: The gate's name.
    """
    waiting = _GATES[gate]
    waiting.entered.set()
    await waiting.opened.wait()
    return {"released": gate}


class SaveReport(Tool):
    """A terminal tool: a completed call ends the turn with "Saved."."""

    description = "Save the final report."
    terminal = "Saved."

    class Arguments(BaseModel):
        title: str

    def call(self, context: ToolContext, *, title: str) -> dict[str, Any]:
        return {"id": f"report-{title}"}


@turnkit.tool(terminal=True)
async def file_memo(memo: str, gate: str = "") -> str:
    """File the memo: a terminal tool whose answer is the memo.

    Args:
        memo: The memo.
        gate: A gate to hold on first (none when empty).
    """
    if gate:
        waiting = _GATES[gate]
        waiting.entered.set()
        await waiting.opened.wait()
    return memo


def needs_recommendation(output: str) -> dict[str, Any] | None:
    """An output-policy constraint: the answer must give a Recommendation."""
    if "Recommendation" in output:
        return None
    return {"rule": "needs_recommendation", "message": "output has no Recommendation"}


#: The judged agent's two output-policy judges (LLM judges: each of their calls is a paid call of the turn).
_JUDGES = (
    turnkit.OutputPolicy("Memos end with a Recommendation.", name="recommendation"),
    turnkit.OutputPolicy("Memos are brief.", name="brevity"),
)


def judge_memos(request: turnkit.ModelRequest) -> str:
    """The scripted judges' verdict: a memo is approved when it gives a Recommendation."""
    approved = "Recommendation" in str(request.messages[0]["content"])
    violations = [] if approved else [{"rule": "recommendation", "message": "no Recommendation"}]
    return json.dumps({"approved": approved, "violations": violations})


# -- agents -----------------------------------------------------------------------------------------------------------

TOOLS_AGENT = "history_tools"
FAILURES_AGENT = "history_failures"
BUDGET_AGENT = "history_budget"
LANE_AGENT = "history_lane"
TERMINAL_AGENT = "history_terminal"
FANOUT_AGENT = "history_fanout"
ALPHA_AGENT = "history_alpha"
BETA_AGENT = "history_beta"
DELIVERY_AGENT = "history_delivery"
WAIT_TARGET_AGENT = "history_wait_target"
WAITER_AGENT = "history_waiter"
PAUSE_AGENT = "history_pausable"
DEADLINE_AGENT = "history_gated"
STEER_AGENT = "history_steerable"
LAUNCHER_AGENT = "history_launcher"
HELPER_AGENT = "history_helper"
AUDITED_AGENT = "history_audited"
JUDGED_AGENT = "history_judged"
LOCAL_TOOLS_AGENT = "history_local_tools"
DIRECT_AGENT = "history_direct"
#: The agents the team's ``ApprovalWorkflow`` asks by name (tests/team_app.py).
TEAM_AGENTS = ("drafter", "legal", "finance")

#: Agent name -> (tools, limits). The definitions must not change once histories are recorded with them.
_AGENTS: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {
    TOOLS_AGENT: ((lookup, notify), {}),
    FAILURES_AGENT: ((lookup, boom), {}),
    BUDGET_AGENT: ((lookup,), {"max_iterations": 1}),
    LANE_AGENT: ((lookup,), {}),
    TERMINAL_AGENT: ((SaveReport, lookup), {}),
    FANOUT_AGENT: ((), {}),
    ALPHA_AGENT: ((hold,), {}),
    BETA_AGENT: ((hold,), {}),
    DELIVERY_AGENT: ((hold,), {}),
    WAIT_TARGET_AGENT: ((hold,), {}),
    WAITER_AGENT: ((wait_for,), {}),
    PAUSE_AGENT: ((hold,), {}),
    DEADLINE_AGENT: ((), {"timeout": 2}),
    STEER_AGENT: ((hold, lookup), {}),
    LAUNCHER_AGENT: ((launch_agent,), {}),
    HELPER_AGENT: ((hold,), {}),
    AUDITED_AGENT: ((file_memo,), {"output_policy": needs_recommendation, "output_retries": 1}),
    JUDGED_AGENT: ((file_memo,), {"output_policy": list(_JUDGES), "output_retries": 1}),
    LOCAL_TOOLS_AGENT: ((lookup_local, notify_local, flaky_local), {}),
    DIRECT_AGENT: ((hold,), {}),
    **dict.fromkeys(TEAM_AGENTS, ((), {})),
}

#: Agent name -> its sub-agents (themselves in ``_AGENTS``), exposed as delegation tools named after them.
_SUB_AGENTS: dict[str, tuple[str, ...]] = {
    FANOUT_AGENT: (ALPHA_AGENT, BETA_AGENT),
    LAUNCHER_AGENT: (HELPER_AGENT,),
}


def scenario_agent(
    name: str, client: ScriptedClient | None = None, *, sub_clients: Mapping[str, ScriptedClient] | None = None
) -> Agent:
    """A scenario agent; ``client`` (and ``sub_clients``, by sub-agent name) are only needed to run it (replay never
    calls the model)."""
    tools, limits = _AGENTS[name]
    clients = sub_clients or {}
    sub_agents = [scenario_agent(sub, clients.get(sub), sub_clients=clients) for sub in _SUB_AGENTS.get(name, ())]
    return Agent(name, model="scripted", tools=tools, sub_agents=sub_agents, client=client, **limits)


def register_scenario_agents() -> None:
    """Register every scenario agent (without a model client); safe to call repeatedly."""
    for name in _AGENTS:
        register(scenario_agent(name))


# -- helpers ----------------------------------------------------------------------------------------------------------


async def _conversation(
    tk: TurnKit,
    agent_name: str,
    script: list[ScriptItem] | ScriptedClient,
    sub_scripts: Mapping[str, list[ScriptItem]] | None = None,
) -> turnkit.Conversation:
    client = script if isinstance(script, ScriptedClient) else ScriptedClient(script)
    sub_clients = {name: ScriptedClient(items) for name, items in (sub_scripts or {}).items()}
    return await tk.conversation(scenario_agent(agent_name, client, sub_clients=sub_clients))


async def _settled(
    tk: TurnKit, workflow_id: str, counts: Mapping[EventType.ValueType, int], *, what: str, timeout: float = 30.0
) -> None:
    """Wait until the workflow's history holds at least ``counts`` events of each type and ends at a completed
    workflow task (nothing in flight for the workflow itself).

    Input sent to the workflow after that (a signal, a gate opened) lands in a new workflow task, so a recording
    does not depend on timing. A workflow not started yet is waited for.
    """
    handle = tk.client.get_workflow_handle(workflow_id)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            events = list((await handle.fetch_history()).events)
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
            events = []
        if ends_at_completed_task(events) and all(_count(events, t) >= n for t, n in counts.items()):
            return
        if loop.time() > deadline:
            raise AssertionError(f"{workflow_id} did not settle: {what}")
        await asyncio.sleep(0.05)


def ends_at_completed_task(events: list[HistoryEvent]) -> bool:
    """Whether the history ends at a completed workflow task: nothing is in flight for the workflow itself. An upsert
    of search attributes and a marker (a patch, a local activity's result) are recorded after their task completed."""
    last = [e for e in events if e.event_type not in _RECORDED_WITH_TASK][-1:]
    return bool(last) and last[0].event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


def _count(events: list[HistoryEvent], event_type: EventType.ValueType) -> int:
    """How many events of ``event_type``; completed activities include the store calls that ran as local activities
    (patch ``local-store-calls``: their result is a marker)."""
    count = sum(1 for e in events if e.event_type == event_type)
    if event_type == ACTIVITY_COMPLETED:
        markers = (e for e in events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED)
        count += sum(1 for e in markers if e.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER)
    return count


def local_activities(events: list[HistoryEvent]) -> list[tuple[int, str]]:
    """Each local activity's result marker in a history: (its index in ``events``, its activity type), in order."""
    found: list[tuple[int, str]] = []
    for index, event in enumerate(events):
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == LOCAL_ACTIVITY_MARKER:
                found.append((index, json.loads(marker.details["data"].payloads[0].data)["activity_type"]))
    return found


def patch_markers(events: Sequence[HistoryEvent]) -> list[str]:
    """The patch ids a history's patch markers record, and a ``TemporalChangeVersion`` entry for each upsert of it."""
    found: list[str] = []
    for event in events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            marker = event.marker_recorded_event_attributes
            if marker.marker_name == "core_patch":
                found.append(json.loads(marker.details["patch-data"].payloads[0].data)["id"])
        if event.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
            if "TemporalChangeVersion" in fields:
                found.append("TemporalChangeVersion")
    return found


def run_input(events: Sequence[HistoryEvent]) -> dict[str, Any]:
    """A run's input (a lane's ``LaneInput``, a turn's ``TurnInput``) as JSON, from its first event."""
    started = events[0].workflow_execution_started_event_attributes
    return json.loads(started.input.payloads[0].data)


async def history_events(tk: TurnKit, workflow_id: str) -> list[HistoryEvent]:
    """The events of a workflow's latest run, as the server holds them now."""
    return list((await tk.client.get_workflow_handle(workflow_id).fetch_history()).events)


def local_activity_types(events: list[HistoryEvent]) -> list[str]:
    """The types of the local activities a history ran (their markers), in order."""
    return [kind for _, kind in local_activities(events)]


def scheduled_activities(events: list[HistoryEvent]) -> list[str]:
    """The types of the activities a history scheduled (activity tasks, not local activities), in order."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


def activity_types(events: list[HistoryEvent]) -> list[str]:
    """The activity types a history ran, in order: scheduled activities and local activities (their markers)."""
    local = dict(local_activities(events))
    types: list[str] = []
    for index, event in enumerate(events):
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            types.append(event.activity_task_scheduled_event_attributes.activity_type.name)
        elif index in local:
            types.append(local[index])
    return types


async def _lane_settled(tk: TurnKit, conversation_id: str, turns: int, *, timeout: float = 30.0) -> None:
    """Wait until the lane has started ``turns`` turns and has no workflow task in flight (called once those turns
    ended: then its history no longer grows, and a recording does not depend on timing).

    The lane learns of a turn's end only when it has more to run (patch ``lane-follows-on-demand``): from the
    turn's ``target_finished`` signal, or from ``turnkit.follow_turn`` when the turn had ended already. So the last
    turn's end never reaches it.
    """
    handle = tk.client.get_workflow_handle(conversation_id)

    async def settled() -> bool:
        events = list((await handle.fetch_history()).events)
        return ends_at_completed_task(events) and started_turns(events) >= turns

    await eventually(settled, timeout=timeout, what=f"lane {conversation_id} to settle after {turns} turn(s)")


async def _lane_started(tk: TurnKit, conversation_id: str, turns: int, *, what: str) -> None:
    """Wait until the lane (its current run) has started ``turns`` turns and has no workflow task in flight."""
    handle = tk.client.get_workflow_handle(conversation_id)

    async def started() -> bool:
        events = list((await handle.fetch_history()).events)
        return ends_at_completed_task(events) and started_turns(events) >= turns

    await eventually(started, what=what)


def carried_turn(events: Sequence[HistoryEvent]) -> str | None:
    """The turn a lane run was started to follow (its predecessor continued as new while that turn ran), or None."""
    active = run_input(events).get("active")
    return None if active is None else str(active["turn_id"])


def started_turns(events: list[HistoryEvent]) -> int:
    """How many turns a lane's history started: ``turnkit.start_turn`` calls, or child starts in older lanes."""
    children = sum(1 for e in events if e.event_type == CHILD_STARTED)
    return children + activity_types(events).count("turnkit.start_turn")


def _requests_text(client: ScriptedClient) -> list[str]:
    """The message contents of each request a scripted client received, joined per request."""
    return ["\n".join(str(m["content"]) for m in request.messages) for request in client.requests]


ACTIVITY_COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
#: Events a completed workflow task's commands leave after its completion event.
_RECORDED_WITH_TASK = (
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
    EventType.EVENT_TYPE_MARKER_RECORDED,
    EventType.EVENT_TYPE_TIMER_STARTED,
    EventType.EVENT_TYPE_TIMER_CANCELED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
)
#: The marker a local activity's result is recorded in (Temporal's Core SDK).
LOCAL_ACTIVITY_MARKER = "core_local_activity"
CHILD_STARTED = EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED
SIGNALED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
CHILD_COMPLETED = EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED


# -- scenarios --------------------------------------------------------------------------------------------------------


async def turn_tools(tk: TurnKit) -> list[Recorded]:
    """Three iterations: a replay-safe tool twice, then an at-most-once tool, then a final answer."""
    conversation = await _conversation(
        tk,
        TOOLS_AGENT,
        [
            call_tools(("lookup", {"q": "a"}), ("lookup", {"q": "b"})),
            call_tools(("notify", {"message": "found A and B"})),
            "all done",
        ],
    )
    turn = await conversation.ask("look things up, then tell someone")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "all done"
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [
        ("lookup", "completed"),
        ("lookup", "completed"),
        ("notify", "completed"),
    ]
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id, conversation.id]


async def turn_local_tools(tk: TurnKit) -> list[Recorded]:
    """Local tool calls (``@tool(local=True)``): a replay-safe and an at-most-once call, then a replay-safe call whose
    local attempt fails and whose second attempt runs as a regular activity, then a final answer."""
    conversation = await _conversation(
        tk,
        LOCAL_TOOLS_AGENT,
        [
            call_tools(("lookup_local", {"q": "a"}), ("notify_local", {"message": "found A"})),
            call_tools(("flaky_local", {"q": "b"})),
            "all done",
        ],
    )
    turn = await conversation.ask("look things up locally")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "all done"
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [
        ("lookup_local", "completed"),
        ("notify_local", "completed"),
        ("flaky_local", "completed"),
    ]
    assert executions[2].result == {"answer": "B", "attempt": 2}
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def turn_local_model(tk: TurnKit) -> list[Recorded]:
    """``model_local_activity``: each model call's first attempt is a local activity. The first proposes a tool call
    (an activity); the second's local attempt fails as a provider's overload would (after its ``retry-after``) and
    runs again as a regular ``turnkit.model`` activity, which answers. A fresh conversation's direct first turn."""
    attempts = settings.model_max_attempts
    configure(direct_first_turns=True, model_local_activity=True, model_max_attempts=3)

    def overloaded(request: turnkit.ModelRequest) -> turnkit.Result:
        raise TransientModelError("APIStatusError: overloaded", retry_after=0.2)

    try:
        conversation = await _conversation(tk, TOOLS_AGENT, [call_tools(("lookup", {"q": "a"})), overloaded, "found A"])
        turn = await conversation.ask("look it up")
    finally:
        configure(model_local_activity=False, model_max_attempts=attempts)
    assert (turn.status, turn.output_text) == ("completed", "found A"), turn.error
    events = await history_events(tk, turn.id)
    assert local_activity_types(events).count("turnkit.model") == 2, local_activity_types(events)
    assert scheduled_activities(events) == ["tool:lookup", "turnkit.model"], scheduled_activities(events)
    return [turn.id]


async def turn_tool_failures(tk: TurnKit) -> list[Recorded]:
    """A ToolError, arguments of the wrong type and an unknown tool, then a final answer."""
    conversation = await _conversation(
        tk,
        FAILURES_AGENT,
        [
            call_tools(("boom", {"reason": "on purpose"}), ("lookup", {"q": 123}), ("no_such_tool", {})),
            "recovered",
        ],
    )
    turn = await conversation.ask("try everything")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "recovered"
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [
        ("boom", "failed"),
        ("lookup", "failed"),
        ("no_such_tool", "failed"),
    ]
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def turn_budget(tk: TurnKit) -> list[Recorded]:
    """``max_iterations=1`` and a tool call: the second model request is denied and the turn fails."""
    conversation = await _conversation(tk, BUDGET_AGENT, [call_tools(("lookup", {"q": "a"})), "never reached"])
    turn = await conversation.ask("use a tool")
    assert turn.status == "failed"
    assert turn.error is not None and turn.error.get("message") == "maximum iterations reached", turn.error
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def lane_two_turns(tk: TurnKit) -> list[Recorded]:
    """Two turns submitted at once to one conversation run one after the other; keeps the (open) lane history."""
    conversation = await _conversation(
        tk, LANE_AGENT, [call_tools(("lookup", {"q": "first"})), "first done", "second done"]
    )
    first = await conversation.ask("first", wait=False)
    second = await conversation.ask("second", wait=False)
    first, second = await first.result(timeout=60), await second.result(timeout=60)
    assert (first.status, first.output_text) == ("completed", "first done"), first.error
    assert (second.status, second.output_text) == ("completed", "second done"), second.error
    await _lane_settled(tk, conversation.id, 2)
    return [conversation.id]


async def turn_terminal_tool(tk: TurnKit) -> list[Recorded]:
    """A terminal tool ends the turn with its message; the sibling call after it is skipped."""
    conversation = await _conversation(
        tk, TERMINAL_AGENT, [call_tools(("save_report", {"title": "q3"}), ("lookup", {"q": "skipped"}))]
    )
    turn = await conversation.ask("save the report")
    assert turn.status == "completed", turn.error
    assert turn.output_text == "Saved."
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [("save_report", "completed"), ("lookup", "cancelled")]
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def terminal_answer_audit(tk: TurnKit) -> list[Recorded]:
    """A terminal tool's answer is audited by the finish (patch ``terminal-answer-audit``): a dirty one goes back to
    the model as a revision request; the clean resubmission meets a pause requested while its tool ran, is held, and
    is published once resumed."""
    gate = _gate("terminal-pause")
    client = ScriptedClient(
        [
            call_tools(("file_memo", {"memo": "Draft only"})),
            call_tools(("file_memo", {"memo": "Recommendation: ship it", "gate": "terminal-pause"})),
        ]
    )
    conversation = await _conversation(tk, AUDITED_AGENT, client)
    turn = await conversation.ask("file the memo", wait=False)
    await gate.wait_entered()
    await turn.pause()
    gate.opened.set()
    # model, tool, finish (a revision request), model, tool, finish (held at the pause): waiting for the resume.
    await _settled(tk, turn.id, {ACTIVITY_COMPLETED: 6}, what="the terminal answer held at the pause")
    held = await turn.refresh()
    assert held.status == "paused" and held.record.options.state.candidate == "Recommendation: ship it"
    await turn.resume()
    turn = await turn.result(timeout=60)
    assert (turn.status, turn.output_text) == ("completed", "Recommendation: ship it"), turn.error
    assert turn.policy_clean is True and client.calls == 2
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def answer_audit(tk: TurnKit) -> list[Recorded]:
    """Answers committed before their audit, one paid judge call per activity: a final answer is committed by
    ``turnkit.model``, then judged by one ``turnkit.audit`` per judge (the last one publishes it); the first answer
    fails and is sent back for a revision, the revision passes. Then a terminal tool's answer is judged one
    ``turnkit.finish_turn`` per judge call (``FinishTurn.judge_apart``)."""
    answers = iter(
        [
            "Draft only",
            "Recommendation: ship it",
            call_tools(("file_memo", {"memo": "Recommendation: file it"})),
        ]
    )

    def respond(request: turnkit.ModelRequest) -> turnkit.Result | str:
        return judge_memos(request) if request.metadata.get("purpose") == "output_policy" else next(answers)

    client = ScriptedClient(respond)
    conversation = await _conversation(tk, JUDGED_AGENT, client)
    answered = await conversation.ask("write the memo")
    assert (answered.status, answered.output_text) == ("completed", "Recommendation: ship it"), answered.error
    assert answered.record.options.state.revisions_used == 1 and answered.policy_clean is True
    filed = await conversation.ask("file it")
    assert (filed.status, filed.output_text) == ("completed", "Recommendation: file it"), filed.error
    assert client.calls == 3 + 3 * len(_JUDGES)  # three answers, each judged by both judges once
    assert activity_types(await history_events(tk, answered.id)).count("turnkit.audit") == 2 * len(_JUDGES)
    assert activity_types(await history_events(tk, filed.id)).count("turnkit.finish_turn") == len(_JUDGES)
    await _lane_settled(tk, conversation.id, 2)
    return [answered.id, ("terminal", filed.id)]


async def subagent_fanout(tk: TurnKit) -> list[Recorded]:
    """Two sub-agent calls in one response run as parallel child turns, each calling one tool; joined in call order.

    Both children are held inside their tool until both have started, then finish one after the other, so the
    parent's history has a fixed order of child events.
    """
    alpha, beta = _gate("fanout-alpha"), _gate("fanout-beta")
    conversation = await _conversation(
        tk,
        FANOUT_AGENT,
        [call_tools((ALPHA_AGENT, {"task": "part a"}), (BETA_AGENT, {"task": "part b"})), "merged"],
        {
            ALPHA_AGENT: [call_tools(("hold", {"gate": "fanout-alpha"})), "alpha done"],
            BETA_AGENT: [call_tools(("hold", {"gate": "fanout-beta"})), "beta done"],
        },
    )
    turn = await conversation.ask("split the work", wait=False)
    await alpha.wait_entered()
    await beta.wait_entered()
    await _settled(tk, turn.id, {CHILD_STARTED: 2}, what="both children started")
    alpha.opened.set()
    await _settled(tk, turn.id, {CHILD_COMPLETED: 1}, what="the first child joined")
    beta.opened.set()
    turn = await turn.result(timeout=60)
    assert (turn.status, turn.output_text) == ("completed", "merged"), turn.error
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [(ALPHA_AGENT, "completed"), (BETA_AGENT, "completed")]
    children = {t.agent_name: t for t in await tk.store.list_turns(root_turn_id=turn.id) if t.id != turn.id}
    assert sorted(children) == [ALPHA_AGENT, BETA_AGENT]
    assert all(c.status == "completed" and c.parent_turn_id == turn.id for c in children.values())
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id, ("child", children[ALPHA_AGENT].id)]


async def delivery_wake(tk: TurnKit) -> list[Recorded]:
    """A post to an idle conversation wakes a turn; a post while that turn is busy is consumed by the next turn."""
    gate = _gate("delivery")
    client = ScriptedClient([call_tools(("hold", {"gate": "delivery"})), "first done", "second done"])
    conversation = await _conversation(tk, DELIVERY_AGENT, client)
    await conversation.post("wake up", key=f"{conversation.id}:wake-1")  # keys are global: unique per run
    await gate.wait_entered()
    await _lane_started(tk, conversation.id, 1, what="the woken turn started")
    await conversation.post("while you were busy", key=f"{conversation.id}:busy-1")
    # The busy lane holds the second delivery until the turn ends (one deliver activity so far: the wake).
    await _settled(tk, conversation.id, {SIGNALED: 2}, what="the second post held by the busy lane")
    assert len(await conversation.turns()) == 1
    gate.opened.set()
    await _lane_started(tk, conversation.id, 2, what="the second turn started")
    first, second = [await t.result(timeout=60) for t in await conversation.turns()]
    await _lane_settled(tk, conversation.id, 2)
    assert (first.status, first.output_text) == ("completed", "first done"), first.error
    assert (second.status, second.output_text) == ("completed", "second done"), second.error
    texts = _requests_text(client)
    assert "wake up" in texts[0] and not any("while you were busy" in t for t in texts[:2])
    assert "while you were busy" in texts[2]
    return [conversation.id]


async def wait_for_turn(tk: TurnKit) -> list[Recorded]:
    """The ``wait_for`` tool on a turn in another conversation; woken by its ``target_finished`` signal."""
    gate = _gate("wait-target")
    target_conversation = await _conversation(
        tk, WAIT_TARGET_AGENT, [call_tools(("hold", {"gate": "wait-target"})), "target done"]
    )
    target = await target_conversation.ask("work", wait=False)
    await gate.wait_entered()
    client = ScriptedClient([call_tools(("wait_for", {"turn_ids": [target.id]})), "waited"])
    waiter_conversation = await _conversation(tk, WAITER_AGENT, client)
    waiter = await waiter_conversation.ask("wait for the target", wait=False)
    # turnkit.model, then turnkit.wait: the waiter now blocks on the target's signal.
    await _settled(tk, waiter.id, {ACTIVITY_COMPLETED: 2}, what="the wait edge written")
    assert (await waiter.refresh()).status == "waiting"
    gate.opened.set()
    waiter = await waiter.result(timeout=60)
    assert (waiter.status, waiter.output_text) == ("completed", "waited"), waiter.error
    [result] = [json.loads(m["content"]) for m in client.requests[1].messages if m["role"] == "tool"]
    assert result["results"][0]["turn_id"] == target.id and result["results"][0]["result"] == "target done"
    await _lane_settled(tk, target_conversation.id, 1)
    await _lane_settled(tk, waiter_conversation.id, 1)
    return [waiter.id]


async def pause_resume(tk: TurnKit) -> list[Recorded]:
    """A pause requested while a tool runs is acknowledged at the next boundary (the next model activity, before it
    calls the model); ``resume`` goes on from there."""
    gate = _gate("pause")
    client = ScriptedClient([call_tools(("hold", {"gate": "pause"})), "resumed answer"])
    conversation = await _conversation(tk, PAUSE_AGENT, client)
    turn = await conversation.ask("start", wait=False)
    await gate.wait_entered()
    paused = await turn.pause()
    assert paused.status == "running" and paused.record.options.controls_or_default.pause_requested is True
    gate.opened.set()
    # turnkit.model, the tool, then turnkit.model again: its boundary acknowledges the pause without calling the
    # model, and the workflow waits for the resume signal.
    await _settled(tk, turn.id, {ACTIVITY_COMPLETED: 3}, what="the pause acknowledged")
    assert (await turn.refresh()).status == "paused"
    assert client.calls == 1
    await turn.resume()
    turn = await turn.result(timeout=60)
    assert (turn.status, turn.output_text) == ("completed", "resumed answer"), turn.error
    assert [(e.tool_name, e.status) for e in await turn.tool_executions()] == [("hold", "completed")]
    assert client.calls == 2
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def pause_past_deadline(tk: TurnKit) -> list[Recorded]:
    """A turn submitted paused outlives its root deadline (patch ``pause-outlasts-deadline``): at the deadline,
    ``turnkit.finish_turn`` finds it paused and writes nothing; resumed, it fails "turn timed out" at once."""
    client = ScriptedClient(["never asked"])
    conversation = await _conversation(tk, DEADLINE_AGENT, client)
    turn = await conversation.ask("approve me", paused=True)
    # turnkit.model (its boundary: paused), then at the deadline turnkit.finish_turn (paused: nothing written).
    await _settled(
        tk, turn.id, {ACTIVITY_COMPLETED: 2, EventType.EVENT_TYPE_TIMER_FIRED: 1}, what="the deadline passed paused"
    )
    assert (await turn.refresh()).status == "paused"
    await turn.resume()
    turn = await turn.result(timeout=60)
    assert turn.status == "failed" and turn.error == {"class": "TurnKit::BudgetError", "message": "turn timed out"}
    assert client.calls == 0
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def steer(tk: TurnKit) -> list[Recorded]:
    """Steering while a tool runs: applied at the next boundary (the second call's activity), which supersedes that
    call; the model then sees the steering input."""
    gate = _gate("steer")
    client = ScriptedClient(
        [call_tools(("hold", {"gate": "steer"}), ("lookup", {"q": "superseded"})), "steered answer"]
    )
    conversation = await _conversation(tk, STEER_AGENT, client)
    turn = await conversation.ask("start", wait=False)
    await gate.wait_entered()
    [receipt] = await turn.steer("focus on debt", key="steer-1", principal="human")
    assert "message_id" not in receipt
    gate.opened.set()
    turn = await turn.result(timeout=60)
    assert (turn.status, turn.output_text) == ("completed", "steered answer"), turn.error
    executions = await turn.tool_executions()
    assert [(e.tool_name, e.status) for e in executions] == [("hold", "completed"), ("lookup", "cancelled")]
    assert client.requests[1].messages[-1] == {"role": "user", "content": "focus on debt"}
    await _lane_settled(tk, conversation.id, 1)
    return [turn.id]


async def launch_callback(tk: TurnKit) -> list[Recorded]:
    """``launch_agent`` with ``callback=True``: the parent turn ends while the launched child (ABANDON) still runs;
    the child's result is delivered to the parent's conversation and wakes a second turn there.

    The child is held in its tool until the parent turn has closed, so no child event reaches the parent's history.
    """
    gate = _gate("launch")
    conversation = await _conversation(
        tk,
        LAUNCHER_AGENT,
        [
            call_tools(("launch_agent", {"agent_name": HELPER_AGENT, "task": "help", "callback": True})),
            "launched",
            "got the callback",
        ],
        {HELPER_AGENT: [call_tools(("hold", {"gate": "launch"})), "helper done"]},
    )
    turn = await conversation.ask("start")
    assert (turn.status, turn.output_text) == ("completed", "launched"), turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "completed" and execution.result is not None
    launched = tk.turn(execution.result["turn_id"])
    await gate.wait_entered()
    gate.opened.set()
    launched = await launched.result(timeout=60)
    assert (launched.status, launched.output_text) == ("completed", "helper done"), launched.error
    assert launched.record.parent_turn_id == turn.id
    await _lane_started(tk, conversation.id, 2, what="the woken turn started")
    [_, woken] = [await t.result(timeout=60) for t in await conversation.turns()]
    await _lane_settled(tk, conversation.id, 2)
    assert (woken.status, woken.output_text) == ("completed", "got the callback"), woken.error
    [delivery] = await conversation.inbox()
    assert delivery.key == f"completion:{launched.id}"
    return [turn.id]


async def direct_first_turn(tk: TurnKit) -> list[Recorded]:
    """Issue 9: a fresh conversation's first turn runs without its lane; a second ask while it holds in a tool starts
    the lane, whose submit names the direct turn ``ahead``: the lane runs it first (its start finds the workflow
    running) and follows it to its end, then runs the second turn. Keeps the direct turn's history and the lane's."""
    configure(direct_first_turns=True)
    gate = _gate("direct")
    script = [call_tools(("hold", {"gate": "direct"})), "first done", "second done"]
    conversation = await _conversation(tk, DIRECT_AGENT, script)
    first = await conversation.ask("first", wait=False)
    await gate.wait_entered()
    second = await conversation.ask("second", wait=False)
    await _lane_started(tk, conversation.id, 1, what="the lane following the direct turn")
    gate.opened.set()
    first, second = await first.result(timeout=60), await second.result(timeout=60)
    assert (first.status, first.output_text) == ("completed", "first done"), first.error
    assert (second.status, second.output_text) == ("completed", "second done"), second.error
    started, ended = second.record.started_at, first.record.completed_at
    assert started is not None and ended is not None and started >= ended, "the second turn ran alongside the first"
    await _lane_settled(tk, conversation.id, 2)
    return [first.id, conversation.id]


async def client_requests(tk: TurnKit) -> list[Recorded]:
    """The client's requests that run as workflows of their own: a manual compaction, a standalone paint, a
    standalone paint whose provider stays away (its attempts run out, then the turn is recorded failed) and a cancel
    (its writes, then its announcements)."""

    def answer(request: turnkit.ModelRequest) -> str:
        if request.metadata.get("compaction"):
            return "## Active Task\nRecorded."
        raise TransientModelError("overloaded")

    client = ScriptedClient(answer, images=[image(b"\x89PNG\r\n\x1a\nIHDR" + bytes(range(64)))])
    agent = Agent("requester", model="scripted", client=client, compaction={"tail_messages": 2})
    conversation = await tk.conversation(agent)
    for i in range(6):
        await conversation.say(f"note {i}: " + "x" * 200)
    summary = await conversation.compact(key="recorded")
    painted = await (await conversation.build_turn("paint")).paint("a cat", model="scripted-image")
    assert painted.status == "completed", painted.error
    failing = await conversation.build_turn("look")
    assert painted.record.output_data is not None
    media_id = painted.record.output_data["images"][0]["media_id"]
    attempts = settings.model_max_attempts
    configure(model_max_attempts=1)  # the provider stays away for its only attempt
    try:
        await failing.view_media(media_id, objective="what?")
    except turnkit.ModelError as err:
        assert str(err) == "overloaded"
    else:
        raise AssertionError("the analysis did not fail")
    finally:
        configure(model_max_attempts=attempts)  # the scenarios recorded after this one keep the default
    assert (await failing.refresh()).status == "failed"
    prepared = await conversation.build_turn("never runs")
    assert (await prepared.cancel()).status == "cancelled"
    return [
        f"compact-{summary.id}",
        ("paint", painted.id),
        ("gave-up", failing.id),
        ("cancel", cancel_workflow_id(prepared.id, "retain", None)),
    ]


#: A team's own workflows that a scenario runs (the replayer registers them beside TurnKit's).
TEAM_WORKFLOWS: list[type] = [ApprovalWorkflow]


def _drafts(request: turnkit.ModelRequest) -> str:
    asked = str(request.messages[-1]["content"])
    return "APPROVED: " + " | ".join(asked.splitlines()[1:]) if asked.startswith("Combine") else "DRAFT"


async def team_approval(tk: TurnKit) -> list[Recorded]:
    """A team's own workflow asks agents as its steps (``turnkit.workflow``, tests/team_app.py): a draft in a new
    conversation (its direct first turn), a human's decision (a signal), two reviews in parallel (``run``), a summary
    in the draft's conversation (through its lane). It runs on a task queue of its own, whose worker serves it and
    TurnKit alike, as a team's worker does. Keeps the team workflow's history."""
    configure(direct_first_turns=True)
    clients = {"drafter": ScriptedClient(_drafts), "legal": ScriptedClient(["no risk"])}
    clients["finance"] = ScriptedClient(["cheap"])
    for name, client in clients.items():
        register(scenario_agent(name, client))
    queue = f"{tk.task_queue}-team"
    async with Worker(tk.client, task_queue=queue, workflows=TEAM_WORKFLOWS):
        handle = await tk.client.start_workflow(
            ApprovalWorkflow.run, "a laptop for Sam", id=f"approval-{uuid.uuid4().hex[:12]}", task_queue=queue
        )

        async def drafted() -> bool:
            async with tk.store.reads() as tx:
                waits = await tx.list_waits(turn_id=handle.id)
                return bool(waits) and all([(await tx.load_turn(w.target_turn_id)).terminal for w in waits])

        await eventually(drafted, what="the draft")
        await handle.signal(ApprovalWorkflow.decide, True)
        answer = await asyncio.wait_for(handle.result(), 60)
    assert answer == "APPROVED: Legal: no risk | Finance: cheap", answer
    return [handle.id]


#: The rollover scenario's lane continues as new past this many events: after a finished turn, a running one and a
#: queued one (not before the last was submitted), and not again in the run that follows the running turn.
ROLLOVER_EVENTS = 48


async def lane_busy_rollover(tk: TurnKit) -> list[Recorded]:
    """Issue 8 item 5: a lane past its history threshold while a turn runs continues as new, carrying its queue and
    the running turn; the new run follows that turn (``turnkit.follow_turn``, then the turn's ``target_finished``
    signal) to its end, then runs the queued one.
    Keeps the new run's history (the first run's is replayed by tests/test_history_limits.py)."""
    gate = _gate("rollover")
    conversation = await _conversation(
        tk, DELIVERY_AGENT, ["zero done", call_tools(("hold", {"gate": "rollover"})), "first done", "second done"]
    )
    lane = LaneInput(conversation_id=conversation.id, max_history_events=ROLLOVER_EVENTS)
    handle = await tk.client.start_workflow(
        ConversationWorkflow.run, lane, id=conversation.id, task_queue=tk.task_queue
    )
    zero = await conversation.ask("zero")
    assert (zero.status, zero.output_text) == ("completed", "zero done"), zero.error
    first = await conversation.ask("first", wait=False)
    await gate.wait_entered()
    await _lane_started(tk, conversation.id, 2, what="the first turn running")
    status = await handle.query(ConversationWorkflow.status)
    assert status.run_history_events <= ROLLOVER_EVENTS, status
    second = await conversation.ask("second", wait=False)

    async def rolled_over() -> bool:
        latest = tk.client.get_workflow_handle(conversation.id)
        if (await latest.describe()).run_id != handle.first_execution_run_id:
            return (await latest.query(ConversationWorkflow.status)).active_turn_id == first.id
        # The threshold is checked when a workflow task starts: if the submit's own task did not see it, the next
        # task does (a `wake` is harmless here: no sub-agent turn holds this lane).
        await latest.signal("wake")
        return False

    await eventually(rolled_over, what="the lane to continue as new while the first turn runs")

    # The new run asked the store once (the turn still runs) and waits for the turn's end signal, or a timer.
    async def following() -> bool:
        events = (await tk.client.get_workflow_handle(conversation.id).fetch_history()).events
        return any(e.event_type == EventType.EVENT_TYPE_TIMER_STARTED for e in events)

    await eventually(following, what="the new run to follow the turn")
    gate.opened.set()
    first, second = await first.result(timeout=60), await second.result(timeout=60)
    assert (first.status, first.output_text) == ("completed", "first done"), first.error
    assert (second.status, second.output_text) == ("completed", "second done"), second.error
    assert first.record.completed_at and second.record.started_at
    assert first.record.completed_at <= second.record.started_at
    await _lane_settled(tk, conversation.id, 1)
    events = list((await tk.client.get_workflow_handle(conversation.id).fetch_history()).events)
    assert "turnkit.follow_turn" in activity_types(events), (
        "the latest run is not the one that followed the carried turn"
    )
    return [conversation.id]


async def lane_lost_submission(tk: TurnKit) -> list[Recorded]:
    """Issue 36 items 5 and 7: while a turn runs, a turn whose submission the lane lost (written to the store only)
    waits unknown to the lane; the next submission's ticket names it (``earlier``) and the lane queues it first. A
    ``Turn.result()`` of the last turn waits on the lane's ``turn_started`` update, answered when the lane starts it.
    Keeps the lane's history."""
    gate = _gate("lost")
    conversation = await _conversation(
        tk, DELIVERY_AGENT, [call_tools(("hold", {"gate": "lost"})), "busy done", "lost done", "after done"]
    )
    busy = await conversation.ask("busy", wait=False)
    await gate.wait_entered()
    await _lane_started(tk, conversation.id, 1, what="the busy turn running")
    lost = await stored_pending_turn(tk, conversation.id, resolve_agent(DELIVERY_AGENT), "lost")
    after = await conversation.ask("after", wait=False)
    waiting = asyncio.create_task(after.result(timeout=60))

    async def asked() -> bool:
        events = await history_events(tk, conversation.id)
        return ends_at_completed_task(events) and any(
            e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name == "turn_started"
            for e in events
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
        )

    await eventually(asked, what="result() to wait on the lane")
    gate.opened.set()
    done = await waiting
    assert (done.status, done.output_text) == ("completed", "after done"), done.error
    assert (await busy.result(timeout=60)).output_text == "busy done"
    assert (await tk.turn(lost.id).result(timeout=60)).output_text == "lost done"
    await _lane_settled(tk, conversation.id, 3)
    return [conversation.id]


#: Scenario name (the prefix of its history files) -> scenario.
def _through_lanes(scenario: Scenario) -> Scenario:
    """``scenario`` with every turn through its conversation's lane, the first too: the lane's code is what these
    histories keep replaying (``direct-first-turn`` records the first turn's direct path, issue 9)."""

    async def run(tk: TurnKit) -> list[Recorded]:
        configure(direct_first_turns=False)
        return await scenario(tk)

    return run


SCENARIOS: dict[str, Scenario] = {
    "direct-first-turn": direct_first_turn,
    "turn-tools": _through_lanes(turn_tools),
    "turn-local-tools": _through_lanes(turn_local_tools),
    "turn-local-model": turn_local_model,
    "turn-tool-failures": _through_lanes(turn_tool_failures),
    "turn-budget": _through_lanes(turn_budget),
    "lane-two-turns": _through_lanes(lane_two_turns),
    "turn-terminal-tool": _through_lanes(turn_terminal_tool),
    "terminal-answer-audit": _through_lanes(terminal_answer_audit),
    "answer-audit": _through_lanes(answer_audit),
    "subagent-fanout": _through_lanes(subagent_fanout),
    "delivery-wake": _through_lanes(delivery_wake),
    "wait-for": _through_lanes(wait_for_turn),
    "pause-resume": _through_lanes(pause_resume),
    "pause-past-deadline": _through_lanes(pause_past_deadline),
    "steer": _through_lanes(steer),
    "launch-callback": _through_lanes(launch_callback),
    "lane-busy-rollover": _through_lanes(lane_busy_rollover),
    "lane-lost-submission": _through_lanes(lane_lost_submission),
    "team-approval": team_approval,
    "client-requests": client_requests,
}
