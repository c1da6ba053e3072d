"""What crosses Temporal: workflow, update and activity inputs and results.

These are small by design (ARCHITECTURE: "payloads carry ids and small results, never whole transcripts"): the
transcript, tool results and outputs live in the store, and a turn's history grows by a constant per iteration.
The module is pure (no clocks, no I/O) and is passed through the workflow sandbox.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from turnkit.kernel.records import TerminalTurnStatus, ToolExecutionStatus

__all__ = [
    "OUTPUT_PREVIEW_CHARS",
    "ActivityTarget",
    "AuditCall",
    "CallPolicy",
    "DeliverBatch",
    "DeliverResult",
    "DeliverySignal",
    "FinishTurn",
    "LaneInput",
    "LaneStatus",
    "MCPTarget",
    "ModelCall",
    "ModelOutcome",
    "ModelPolicy",
    "ModelStep",
    "OpenedToolCall",
    "QueuedTurn",
    "SettleToolCall",
    "StartTurn",
    "SubmitTurn",
    "ToolCallInput",
    "ToolCallRef",
    "ToolCallResult",
    "ToolNext",
    "ToolOutcome",
    "TurnInput",
    "TurnOutcome",
    "TurnTicket",
    "output_preview",
]

#: The most characters of a turn's answer its workflow result carries (``TurnOutcome.output_preview``), so the Temporal
#: UI and ``temporal workflow show`` say what the agent answered. The record keeps the whole answer; a payload carries
#: ids and small results, never a transcript: 240 characters is a few lines of the UI's result pane, and however long
#: the answer, the result and the model step that brings it stay far below Temporal's payload limits.
OUTPUT_PREVIEW_CHARS = 240
_ELLIPSIS = "…"


def output_preview(text: str | None) -> str | None:
    """The first :data:`OUTPUT_PREVIEW_CHARS` characters of ``text``, with ``…`` at the end when it was cut (None for
    no text, or an empty one)."""
    if not text:
        return None
    if len(text) <= OUTPUT_PREVIEW_CHARS:
        return text
    return text[: OUTPUT_PREVIEW_CHARS - len(_ELLIPSIS)] + _ELLIPSIS


def _is_none(value: object) -> bool:
    return value is None


def _is_empty(value: object) -> bool:
    return not value


def _is_default_backoff(value: object) -> bool:
    return value == 2.0


#: Fields written only when they differ from their default (None, False, 0, []), which is also what a payload without
#: them decodes to: most calls leave them unset, and each model step and tool call carries them into the history.
#: Only for defaults that can never change: a recorded payload without the field means the default forever.
def _omitted_none() -> Any:
    return Field(default=None, exclude_if=_is_none)


class ModelPolicy(BaseModel):
    """How the turn workflow schedules its ``turnkit.model`` activity, resolved from the settings by whoever creates
    the turn: a workflow never reads settings, so a changed setting cannot break the replay of a turn in flight."""

    timeout: float
    heartbeat: float
    max_attempts: int
    #: The first attempt as a local activity (``settings.model_local_activity``). Left out of the payload when False.
    local: bool = Field(default=False, exclude_if=_is_empty)


class ActivityTarget(BaseModel):
    """The application's own activity a tool call runs as (``turnkit.activity_tool``): its registered name and what of
    its schedule :class:`CallPolicy` does not say already (start-to-close is ``CallPolicy.timeout``, the queue
    ``CallPolicy.task_queue``, the attempts and intervals the policy's retry fields)."""

    activity_type: str
    schedule_to_close: float | None = _omitted_none()
    #: None: the activity does not heartbeat, so no heartbeat timeout is set.
    heartbeat: float | None = _omitted_none()
    backoff_coefficient: float = Field(default=2.0, exclude_if=_is_default_backoff)
    non_retryable_error_types: list[str] = Field(default_factory=list, exclude_if=_is_empty)


class MCPTarget(BaseModel):
    """The MCP server tool a call runs (``Agent(mcp_servers=…)``): the server's name in the agent and the tool's name
    on that server (the model may see it renamed: a prefix, characters a provider refuses)."""

    server: str
    tool: str


class CallPolicy(BaseModel):
    """How the turn workflow dispatches one proposed call, resolved from the agent's definition by the model activity
    (the workflow never reads the live agent registry). ``kind`` picks the path; the rest is the tool
    activity's timeouts and retry policy (from its recovery mode) and the task queue it is scheduled on.

    ``activity``: the call runs as the application's own activity (``turnkit.activity_tool``), opened and committed by
    store calls around it (docs/design.md, "Your activities as tools")."""

    kind: Literal["tool", "sub_agent", "launch_agent", "wait_for", "unknown", "activity"]
    at_most_once: bool = True
    #: The activity's start-to-close timeout. For a tool with ``body_timeout``, that and a window for its store
    #: phases: a commit that waits for the database does not spend the tool's own time.
    timeout: float = 30.0
    heartbeat: float = 30.0
    max_attempts: int = 1
    initial_retry_interval: float = 1.0
    maximum_retry_interval: float = 30.0
    #: The tool's own task queue (``@tool(task_queue=…)``); None: the turn's queue.
    task_queue: str | None = _omitted_none()
    #: The loaded skill that owns this tool, when it is a skill's tool: the tool activity finds it there.
    skill: str | None = _omitted_none()
    #: Run the call as a local activity first (``@tool(local=True)``).
    local: bool = Field(default=False, exclude_if=_is_empty)
    #: Kind ``activity``: the activity the call runs as.
    activity: ActivityTarget | None = _omitted_none()
    #: A tool of one of the agent's MCP servers, run by the tool activity like any tool.
    mcp: MCPTarget | None = _omitted_none()
    #: The tool body's own timeout (``@tool(timeout=…)``), which the tool activity enforces on the body alone. None: a
    #: policy an older release resolved, whose ``timeout`` bounds the body and its store phases together.
    body_timeout: float | None = _omitted_none()


class QueuedTurn(BaseModel):
    """A submitted turn waiting for its lane (carried across continue-as-new)."""

    turn_id: str
    agent_name: str
    root_turn_id: str
    deadline: datetime | None = None
    model_policy: ModelPolicy

    def turn_input(self, conversation_id: str) -> TurnInput:
        """The input of this turn's workflow."""
        return TurnInput(
            turn_id=self.turn_id,
            conversation_id=conversation_id,
            agent_name=self.agent_name,
            root_turn_id=self.root_turn_id,
            deadline=self.deadline,
            model_policy=self.model_policy,
            deadline_without_timer=True,
        )


class SubmitTurn(BaseModel):
    """The lane's ``submit`` update: append the trigger message and create the turn record (ids chosen by the caller).

    The caller picks ``turn_id`` and ``message_id`` so that a retried submission is recognised (idempotent creates).
    With ``staged_input_id``, what the user wrote (``text``, ``context``, ``principal``, ``message_metadata``) is in
    the store under that id and the inline fields are empty, so a user's text never crosses Temporal; without it (a
    repair that re-submits a stored message) they are inline.
    """

    conversation_id: str
    turn_id: str
    message_id: str
    text: str = ""
    #: The store's staged input holding the submission's content (``StoreTx.stage_input``); None: content inline.
    staged_input_id: str | None = None
    agent_name: str | None = None
    model: str | None = None
    message_metadata: dict[str, Any] = Field(default_factory=dict)
    thinking: dict[str, Any] | None = None
    thinking_set: bool = False
    output_schema: dict[str, Any] | None = None
    prompt_mode: str | None = None
    context: dict[str, Any] | None = None
    principal: Any = None
    #: Conversation to receive the finished turn's result as a delivery (key ``completion:<turn_id>``).
    callback_conversation_id: str | None = None
    #: Turns this one waits for before its first model request (their results become its input).
    wait_for: list[str] = Field(default_factory=list)
    #: Join this existing root tree (``run(parent_run=…)``, behaviour §1.2): shared budgets, usage and deadline.
    root_turn_id: str | None = None
    #: Submit paused: an approval gate that runs nothing until ``resume`` (behaviour §5.10).
    paused: bool = False
    #: Compaction for this turn: True forces it before the first model call, False disables it, None: the policy.
    compact: bool | None = None
    #: Budget limits for this turn's tree, merged over the agent's (behaviour §6.1 names).
    budget: dict[str, Any] | None = None
    #: References (``media`` content parts) to media stored before submission: the bytes are in the store.
    media: list[dict[str, Any]] = Field(default_factory=list)
    #: Set by the lane: the newest turn it has queued. The submit returns the submitted turns after that one that the
    #: lane does not know (``TurnTicket.earlier``). None: the lane knows none, or a caller that is not a lane.
    known_turn_id: str | None = Field(default=None, exclude_if=_is_empty)


class DeliverySignal(BaseModel):
    """The lane's ``deliver`` signal: a wake-up naming a delivery row (the row is the truth)."""

    delivery_id: str


class DeliverBatch(BaseModel):
    """Input of ``turnkit.deliver``: append these deliveries to the lane's conversation, and maybe wake it."""

    conversation_id: str
    delivery_ids: list[str] = Field(default_factory=list)
    #: The lane is idle: start a turn for the delivered input (behaviour §5.11 ``wake``).
    wake: bool = False
    #: The id a woken turn gets, chosen by the lane, so every run of this call finds the turn an earlier one created: a
    #: local attempt, its regular-activity fallback, a retried workflow task. None when ``wake`` is False.
    woken_turn_id: str | None = None
    #: The newest turn the lane has queued (see ``SubmitTurn.known_turn_id``).
    known_turn_id: str | None = Field(default=None, exclude_if=_is_empty)


class DeliverResult(BaseModel):
    """Result of ``turnkit.deliver``: what was appended now, and the turn a wake created."""

    delivered_ids: list[str] = Field(default_factory=list)
    turn: QueuedTurn | None = None
    #: A turn the lane does not run (a sub-agent's) is active in the conversation: nothing was appended; the lane
    #: holds the deliveries until that turn's end sends it ``wake``.
    busy: bool = False
    #: The turn ``ask`` started without the lane (a fresh conversation's first) is active: nothing was appended and
    #: no turn woken; the lane runs (follows) it first, then applies the deliveries (docs/design.md).
    ahead: QueuedTurn | None = None
    #: Submitted turns this lane has not queued (their submission was lost with the workflow task that ran it), oldest
    #: first: the lane queues them before the woken turn (docs/design.md, "Lost submissions").
    earlier: list[QueuedTurn] = Field(default_factory=list, exclude_if=_is_empty)


class TurnTicket(BaseModel):
    """What ``submit`` returns at once: the new turn's ids and the deadline of its root tree."""

    turn_id: str
    conversation_id: str
    agent_name: str
    root_turn_id: str
    trigger_message_id: str
    deadline: datetime | None = None
    #: A sub-agent's turn is active in the conversation: the lane starts nothing until its ``wake``.
    busy: bool = False
    model_policy: ModelPolicy
    #: The turn ``ask`` started without the lane (a fresh conversation's first) is still active: the lane runs (follows)
    #: it before this one (docs/design.md, "A fresh conversation's first turn").
    ahead: QueuedTurn | None = None
    #: Turns submitted before this one that the lane has not queued (their submission was lost with the workflow task
    #: that ran it), oldest first: the lane queues them before this one (docs/design.md, "Lost submissions").
    earlier: list[QueuedTurn] = Field(default_factory=list, exclude_if=_is_empty)

    def queued(self) -> QueuedTurn:
        """What a lane queues of this turn."""
        return QueuedTurn(
            turn_id=self.turn_id,
            agent_name=self.agent_name,
            root_turn_id=self.root_turn_id,
            deadline=self.deadline,
            model_policy=self.model_policy,
        )


class LaneInput(BaseModel):
    """Start (or continue-as-new) input of a conversation lane."""

    conversation_id: str
    queue: list[QueuedTurn] = Field(default_factory=list)
    #: Recently submitted turn ids, oldest first: a bounded dedupe window that survives continue-as-new.
    recent_turn_ids: list[str] = Field(default_factory=list)
    #: Deliveries signalled but not yet appended, oldest first.
    pending_delivery_ids: list[str] = Field(default_factory=list)
    #: Recently applied delivery ids: a bounded dedupe window (the store's compare-and-set is the backstop).
    recent_delivery_ids: list[str] = Field(default_factory=list)
    #: The pending deliveries wait for a sub-agent's turn in this conversation to end (its ``wake`` signal).
    held: bool = False
    turns_started: int = 0
    #: Continue-as-new once idle with more history events than this (below Temporal's own suggestion).
    max_history_events: int = 2000
    #: The turn this lane ran when it continued as new while busy: the new run follows it to its end.
    active: QueuedTurn | None = None


class LaneStatus(BaseModel):
    """The lane's query result: what runs, what waits."""

    conversation_id: str
    active_turn_id: str | None
    queued_turn_ids: list[str]
    pending_delivery_ids: list[str]
    turns_started: int
    run_history_events: int


class TurnInput(BaseModel):
    """Input of a ``TurnWorkflow``: ids only; everything else is read from the store by the activities."""

    turn_id: str
    conversation_id: str
    agent_name: str
    root_turn_id: str
    deadline: datetime | None = None
    #: 0 for a root turn; each sub-agent level adds one.
    depth: int = 0
    #: Carried across continue-as-new (a long turn): the iterations done, resume signals seen, targets that signalled
    #: their end, and the children launched by earlier runs (now followed through the store and their signals).
    iteration: int = 0
    resumes: int = 0
    finished_turn_ids: list[str] = Field(default_factory=list)
    launched_turn_ids: list[str] = Field(default_factory=list)
    model_policy: ModelPolicy
    #: Enforce ``deadline`` without a Temporal timer while the turn only runs activities that the deadline caps (its
    #: model and tool calls, their schedule-to-close timeout cut to the time left); the timer starts at the first
    #: wait of another kind (docs/design.md, "The turn's deadline"). Every new turn's input sets it; an input
    #: recorded before it existed reads False and keeps the timer from the start, so its history replays as it ran
    #: (a ``workflow.patched`` marker would itself be a billable action). Carried across continue-as-new.
    deadline_without_timer: bool = Field(default=False, exclude_if=_is_empty)


class StartTurn(BaseModel):
    """Input of ``turnkit.start_turn``: the lane's next turn, started as a workflow of its own; with TurnKit's search
    attributes when the lane has them."""

    turn: TurnInput
    search_attributes: bool = False


class EndTurn(BaseModel):
    """Input of ``turnkit.end_turn`` and ``turnkit.follow_turn``: a turn whose workflow ended (or may end) without
    writing its terminal status; ``reason`` says how the workflow ended."""

    turn_id: str
    reason: str = "turn workflow ended without a terminal status"


class TurnOutcome(BaseModel):
    """Result of a ``TurnWorkflow``: the terminal status and the start of the answer; the whole output and usage are
    in the store."""

    turn_id: str
    status: TerminalTurnStatus
    error_class: str | None = None
    error_message: str | None = None
    #: ``turnkit.finish_turn`` with ``unless_paused`` wrote nothing: the turn is paused (not terminal).
    paused: bool = False
    #: ``turnkit.finish_turn`` audited a terminal tool's answer and asked the model for a revision (behaviour
    #: §3.9): the turn is running again, in phase ``model``; ``status`` means nothing then.
    revised: bool = False
    #: ``turnkit.finish_turn`` met a pending control before publishing a terminal tool's answer (behaviour §5.10):
    #: ``paused`` (the answer is held, published once resumed) or ``steered`` (back to the model); ``status`` means
    #: nothing then.
    boundary: Literal["paused", "steered"] | None = None
    #: ``turnkit.finish_turn`` with ``judge_apart`` committed one judge's answer of a terminal tool's answer and
    #: more remain: call it again; ``status`` means nothing then.
    judged: bool = Field(default=False, exclude_if=_is_empty)
    #: The start of the answer of a ``completed`` turn (:func:`output_preview`), for the Temporal UI and ``temporal
    #: workflow show``; the record has the whole of it.
    output_preview: str | None = _omitted_none()


class ToolCallRef(BaseModel):
    """One tool call proposed by the model, as the workflow dispatches it: its id, name and dispatch policy.

    Its arguments stay in the store (the turn's assistant message): a sub-agent's task, a ``send_message`` text or a
    3 MB argument never crosses a Temporal payload. The activity that needs them reads them into the ref
    (:func:`turnkit._engine.executions.with_arguments`, which clears ``arguments_stored``).
    """

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict, exclude_if=_is_empty)
    arguments_error: str | None = _omitted_none()
    #: The arguments are left out here and loaded from the stored assistant message.
    arguments_stored: bool = False
    #: How to dispatch it, as the model activity resolved it (None: as an unknown tool, whose call fails at once).
    policy: CallPolicy | None = None

    @classmethod
    def carried(
        cls,
        id: str,
        name: str,
        arguments_error: str | None = None,
        policy: CallPolicy | None = None,
    ) -> ToolCallRef:
        """The reference that crosses Temporal: ids and the dispatch policy, never the arguments."""
        return cls(id=id, name=name, arguments_error=arguments_error, arguments_stored=True, policy=policy)


class ModelCall(BaseModel):
    """Input of the ``turnkit.model`` activity.

    ``request_id`` is chosen by the workflow (deterministically) and keys the reservation and the persisted response,
    so a retry after the response was committed returns it without calling the model again.
    """

    turn_id: str
    root_turn_id: str
    request_id: str
    iteration: int
    #: Attempts already made as a local activity (0 or 1): a regular activity's retry policy counts the rest. Left
    #: out of the payload when 0.
    attempts_before: int = Field(default=0, exclude_if=_is_empty)
    #: The workflow audits a final answer with activities of their own (``turnkit.audit``): the answer is committed
    #: and charged first, and the step says ``audit``. Unset (a workflow of an older release, or its activity
    #: scheduled before an upgrade): the answer is audited inside this activity, as that workflow expects.
    audit_apart: bool = Field(default=False, exclude_if=_is_empty)


class AuditCall(BaseModel):
    """Input of ``turnkit.audit``: the next step of the output-policy audit of the final answer to ``request_id``
    (docs/design.md, "Every paid call once"): one judge's call, committed with its charge, or the publication."""

    turn_id: str
    root_turn_id: str
    request_id: str


#: What the turn does after a model step (one tag, handled in one place by the workflow):
#: ``tools`` run the proposed calls (none: ask again), ``completed`` the answer was published, ``budget_exceeded`` fail
#: with ``budget_error``, ``stopped`` the turn ended elsewhere (cancelled), ``waiting`` wait for ``waiting_on``, then
#: ask again, ``paused`` wait for ``resume``, then ask again, ``steered`` steering was applied: ask again.
#: ``failed``: the answer was recorded and the turn failed with ``error_class`` (an output audit in ``fail`` mode).
#: ``audit``: the final answer is committed and charged; its audit comes next (``turnkit.audit``, once per judge).
ModelOutcome = Literal[
    "tools", "completed", "budget_exceeded", "stopped", "waiting", "paused", "steered", "failed", "audit"
]


class ModelStep(BaseModel):
    """Result of ``turnkit.model``: what the workflow needs to go on, not the response text."""

    outcome: ModelOutcome = "tools"
    message_id: str | None = None
    tool_calls: list[ToolCallRef] = Field(default_factory=list)
    #: Why a budget limit stopped the turn (``budget_exceeded``; the response, if any, is already persisted).
    budget_error: str | None = _omitted_none()
    #: Application-level waits (``ask(wait_for=...)``) not finished yet (``waiting``).
    waiting_on: list[str] = Field(default_factory=list, exclude_if=_is_empty)
    #: The turn's recorded error (``failed``).
    error_class: str | None = _omitted_none()
    error_message: str | None = _omitted_none()
    #: The start of the published answer (``completed``: :func:`output_preview`), which the workflow's result carries.
    output_preview: str | None = _omitted_none()


class ToolCallInput(BaseModel):
    """Input of a tool activity (activity type ``tool:<name>``)."""

    turn_id: str
    conversation_id: str
    root_turn_id: str
    agent_name: str
    call: ToolCallRef
    #: Attempts of this call made before this activity's first (a local first attempt): ``ToolContext.attempt``
    #: counts on from them.
    attempts_before: int = Field(default=0, exclude_if=_is_empty)


#: What the turn does after one proposed call: ``done`` go on with the next call, ``terminal`` the tool ends the turn,
#: ``budget_exceeded`` fail with ``budget_error``, ``stopped`` the turn was cancelled, ``paused`` (nothing ran) wait
#: for ``resume``, then retry the call, ``steered`` the remaining calls were superseded: ask the model again.
ToolNext = Literal["done", "terminal", "budget_exceeded", "stopped", "paused", "steered"]


class ToolOutcome(BaseModel):
    """Result of a tool activity: the execution's id and status, not its result."""

    outcome: ToolNext = "done"
    execution_id: str = ""
    status: ToolExecutionStatus = "pending"
    budget_error: str | None = _omitted_none()


class OpenedToolCall(BaseModel):
    """Result of ``turnkit.open_tool``: the call's execution is running and its activity may run with ``args``; or the
    call ended before it (``ended``: settled already, denied, over budget, paused, steered, stopped).

    ``args`` are the activity's arguments, so they are in the turn's history: keep an activity tool's arguments small.
    """

    execution_id: str = ""
    args: list[Any] = Field(default_factory=list)
    ended: ToolOutcome | None = None


class ToolCallResult(BaseModel):
    """Input of ``turnkit.commit_tool``: what the activity of a call opened by ``turnkit.open_tool`` returned, to
    record as the execution's result (with its tool-result message)."""

    request: ToolCallInput
    execution_id: str
    result: Any = None


class SettleToolCall(BaseModel):
    """Input of ``turnkit.settle_tool``: record a tool call whose activity failed or was lost."""

    turn_id: str
    conversation_id: str
    call: ToolCallRef
    outcome: Literal["interrupted", "failed"]
    message: str


class FinishTurn(BaseModel):
    """Input of ``turnkit.finish_turn``: the terminal write of a turn the model activity did not complete."""

    turn_id: str
    status: TerminalTurnStatus
    error_class: str | None = None
    error_message: str | None = None
    #: For a turn ended by a terminal tool: its execution, and the calls after it to skip.
    terminal_execution_id: str | None = None
    skipped_calls: list[ToolCallRef] = Field(default_factory=list)
    #: The root deadline's failure: write nothing while the turn is paused (behaviour §5.13 invariant 11).
    unless_paused: bool = False
    #: The workflow calls the finish again while it reports ``judged``: each attempt makes at most one output-policy
    #: judge call of a terminal answer, committed with its charge. Unset (an older workflow): all judges, then the
    #: write, in one attempt.
    judge_apart: bool = Field(default=False, exclude_if=_is_empty)


class DelegateCalls(BaseModel):
    """Input of ``turnkit.delegate``: sub-agent calls (one group of consecutive calls), or one ``launch_agent``."""

    turn_id: str
    root_turn_id: str
    agent_name: str
    depth: int = 0
    deadline: datetime | None = None
    calls: list[ToolCallRef]
    launch: bool = False


class ChildPlan(BaseModel):
    """One delegated call: its execution, and the child turn to run (None when already settled or finished)."""

    call_id: str
    execution_id: str
    child: TurnInput | None = None


class DelegateResult(BaseModel):
    """Result of ``turnkit.delegate``, in call order."""

    plans: list[ChildPlan] = Field(default_factory=list)
    budget_error: str | None = None
    #: The control boundary before creating the children: ``paused`` (nothing was created) or ``steered`` (the calls
    #: were superseded); None: the plans stand.
    boundary: Literal["paused", "steered"] | None = None


class JoinChildren(BaseModel):
    """Input of ``turnkit.join``: settle delegated executions from their children, results in call order."""

    turn_id: str
    root_turn_id: str
    execution_ids: list[str]


class WaitRequest(BaseModel):
    """Input of ``turnkit.wait``: the ``wait_for`` tool call of a turn."""

    turn_id: str
    root_turn_id: str
    call: ToolCallRef


class WaitPlan(BaseModel):
    """Result of ``turnkit.wait``: the execution, every target, and those not finished yet."""

    execution_id: str
    settled: bool = False
    target_ids: list[str] = Field(default_factory=list)
    unfinished_ids: list[str] = Field(default_factory=list)


class FinishWait(BaseModel):
    """Input of ``turnkit.finish_wait``: complete a ``wait_for`` call with its targets' results."""

    turn_id: str
    root_turn_id: str
    execution_id: str
