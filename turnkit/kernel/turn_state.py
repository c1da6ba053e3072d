"""A turn's persisted options and runtime state, typed (issue 9: no more string keys into a JSON dict).

The store keeps them as one JSON column (``turns.options``); :class:`TurnOptions` is that column parsed. What the turn
was built with (trigger message, limits, thinking, context, principal...) is set once; ``controls`` (pause and
steering) and ``state`` (the turn loop's progress: iterations, phase, the answer held back at a pause) change as it
runs, always inside a store transaction that reads the row, copies the model with the change and writes it back.

Writes keep only the keys that were set (``exclude_unset``), so an explicit ``thinking=None`` ("thinking off") stays
distinct from "not given", and a row written by a newer release keeps keys this one does not know (``extra``).
Pure: no clocks, no I/O.
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BudgetLimits",
    "SteeringInput",
    "TurnControls",
    "TurnOptions",
    "TurnPhase",
    "TurnState",
    "changeable_copy",
]

#: Where a running turn is in its loop: asking the model, running its proposed calls, or holding its answer.
TurnPhase = Literal["model", "tools", "output"]

_OPEN = ConfigDict(extra="allow")


class BudgetLimits(BaseModel):
    """The root's limits, snapshotted when the turn is built (None: no limit). A key that was never set (rows older
    than a limit) falls back to the process settings: see :func:`turnkit._engine.budget.limits_of`."""

    model_config = _OPEN

    max_iterations: int | None = None
    timeout: float | None = None
    max_depth: int | None = None
    max_tool_executions: int | None = None
    max_tool_executions_by_name: dict[str, int | None] = Field(default_factory=dict)
    max_spend: float | None = None


class SteeringInput(BaseModel):
    """One steering input (``Turn.steer``): queued, then appended to the transcript (``message_id``), then first sent
    to the model in ``request_id``. Idempotent by ``key``."""

    model_config = _OPEN

    id: str
    key: str
    text: str
    principal: Any = None
    turn_id: str
    sequence: int
    message_id: str | None = None
    request_id: str | None = None

    def receipt(self) -> dict[str, Any]:
        """The receipt returned to the caller (the keys that are set)."""
        return self.model_dump(mode="json", exclude_unset=True)


class TurnControls(BaseModel):
    """Human controls (``docs/design.md`` "Pause, steer, cancel"): the durable source of truth for pause and
    steering."""

    model_config = _OPEN

    pause_requested: bool = False
    inputs: list[SteeringInput] = Field(default_factory=list)

    @property
    def pending(self) -> bool:
        """A pause was requested, or steering waits to be applied."""
        return self.pause_requested or any(item.message_id is None for item in self.inputs)


class TurnState(BaseModel):
    """The turn loop's progress, written by the activities in the same transaction as what it describes."""

    model_config = _OPEN

    #: Model requests reserved by this turn (counted against the tree's ``max_iterations``).
    iterations: int = 0
    #: The request reserved last: a retried model activity with this id returns what was committed.
    request_id: str | None = None
    phase: TurnPhase | None = None
    #: The assistant message of the last response.
    message_id: str | None = None
    #: The answer held back at a pause or by a pending control (published at the next boundary).
    candidate: str | None = None
    output_data: Any = None
    #: The terminal tool that ended the turn.
    terminal_tool_name: str | None = None
    #: Delivery id → the first request that included it (``Turn.input_status``).
    delivery_requests: dict[str, str] = Field(default_factory=dict)
    #: The next suffix for de-duplicated tool-call ids.
    call_id_suffix: int = 1
    #: Application waits (``ask(wait_for=...)``) not finished yet.
    waiting_on: list[str] | None = None
    #: The application waits were joined: their results are the turn's input.
    wait_input: bool = False
    #: Keys of the available skills this turn loaded with ``load_skill``, in load order (``turnkit.skills``): written
    #: with the load's result, so the skill's tools stay in the turn's tool set across iterations and restarts.
    loaded_skills: list[str] = Field(default_factory=list)
    #: Revision requests sent after a dirty output-policy audit (bounded by the agent's ``output_retries``).
    revisions_used: int = 0
    #: The output-policy audit of the latest final answer: ``{clean, violations: [{rule, message, metadata}]}``.
    policy_audit: dict[str, Any] | None = None
    #: The terminal tool execution whose answer was audited last: a retried ``turnkit.finish_turn`` that finds it
    #: here committed that audit already (and, after a revision request, must not ask for a second one).
    audited_execution_id: str | None = None
    #: A model's final answer is committed and charged, and waits for its audit (``turnkit.audit``) before it is
    #: published; ``audit_key`` is its request id.
    awaiting_audit: bool = False
    #: The answer whose output-policy judges have answered so far: a model request's id, or ``terminal:<execution
    #: id>`` for a terminal tool's answer.
    audit_key: str | None = None
    #: Those judges' answers in policy order, each ``{policy, model, text, output_data, usage, cost}``, committed
    #: with the judge call's charge: a retried attempt reads them instead of asking (and paying) again.
    judge_answers: list[dict[str, Any]] = Field(default_factory=list)
    #: Media calls charged although their answer was unusable (no image, no analysis; behaviour §3.12 step 3 before
    #: step 4): the call's message id → its error. A retried attempt that finds its id here raises that error again
    #: instead of calling the client and charging a second time.
    unusable_media_calls: dict[str, str] = Field(default_factory=dict)
    #: Requests whose automatic compaction was answered with an empty summary: that call is charged once, and a
    #: retried attempt of the request does not ask the compaction model again.
    empty_summaries: list[str] = Field(default_factory=list)
    #: The tools of the agent's MCP servers as this turn's first model call listed them, by server name: each
    #: ``{name, tool, description, parameters}`` (the name the model sees, the server's own). Every later model call
    #: and retry of the turn offers exactly these (``turnkit._engine.mcp_tools``).
    mcp_tools: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)

    @property
    def holds_answer(self) -> bool:
        """An answer is held back (phase ``output`` with a candidate, possibly empty)."""
        return self.phase == "output" and self.candidate is not None

    def asking_again(self) -> TurnState:
        """The state after steering: ask the model again; a held answer and a terminal tool's end are dropped."""
        return self.model_copy(
            update={"phase": "model", "candidate": None, "output_data": None, "terminal_tool_name": None}
        )


class TurnOptions(BaseModel):
    """What a turn was built with, plus its controls and loop state (the ``turns.options`` column)."""

    model_config = _OPEN

    trigger_message_id: str | None = None
    budget_limits: BudgetLimits | None = None
    #: None: thinking off (an explicit None is kept, see the module doc).
    thinking: dict[str, Any] | None = None
    context: dict[str, Any] = Field(default_factory=dict)
    output_schema: dict[str, Any] | None = None
    prompt_mode: str | None = None
    principal: Any = None
    callback_conversation_id: str | None = None
    #: The callback delivery was denied: ``{class, message}`` (never retried).
    callback_denied: dict[str, Any] | None = None
    #: 0 for a root turn; each sub-agent level adds one.
    depth: int | None = None
    #: Force (True) or forbid (False) compaction before this turn's first model request.
    compact: bool | None = None
    #: The task queue of a root turn's submission (its lane's, or the one ``ask`` started it on): the workers of that
    #: queue run it again if its submission is lost (docs/design.md, "Lost submissions"). None: older records.
    task_queue: str | None = None
    controls: TurnControls | None = None
    #: Legacy place of the audit (rows of older releases); new audits are written to ``state.policy_audit``.
    policy_audit: dict[str, Any] | None = None
    state: TurnState = Field(default_factory=TurnState)

    def stored(self) -> dict[str, Any]:
        """The JSON written to the store: the keys that were set (and unknown keys kept as they came)."""
        _mark_changed(self)
        return self.model_dump(mode="json", exclude_unset=True)

    def with_state(self, state: TurnState) -> TurnOptions:
        """A copy with ``state`` replaced."""
        return self.model_copy(update={"state": state})

    def with_controls(self, controls: TurnControls) -> TurnOptions:
        """A copy with ``controls`` replaced."""
        return self.model_copy(update={"controls": controls})

    @property
    def controls_or_default(self) -> TurnControls:
        """The controls, or none requested."""
        return self.controls if self.controls is not None else TurnControls()


_Model = TypeVar("_Model", bound=BaseModel)
#: Values that nothing changes in place: a copy shares them, as ``copy.deepcopy`` does.
_SCALARS = (str, int, float, type(None))


def changeable_copy(model: _Model) -> _Model:
    """A copy of ``model`` to change in place and write back: what ``model_copy(deep=True)`` gives (its fields set and
    extra keys kept), made by copying only what can be changed in place (lists, dicts, nested models).

    The loop's state and controls are copied on every model call, and most of their ~20 values are scalars or empty:
    ``copy.deepcopy`` would send each one through its memo and dispatch table."""
    copied = model.model_copy()  # shallow: the values, the fields set and a copy of the extra keys' dict
    values = vars(copied)
    for name, value in values.items():
        if not isinstance(value, _SCALARS):
            values[name] = _changeable(value)
    extra = copied.__pydantic_extra__
    if extra:
        for name, value in extra.items():
            if not isinstance(value, _SCALARS):
                extra[name] = _changeable(value)
    return copied


def _changeable(value: Any) -> Any:
    """A deep copy of a JSON value or a model (anything else through ``copy.deepcopy``)."""
    kind = type(value)
    if kind is dict:
        return {key: item if isinstance(item, _SCALARS) else _changeable(item) for key, item in value.items()}
    if kind is list:
        return [item if isinstance(item, _SCALARS) else _changeable(item) for item in value]
    if isinstance(value, BaseModel):
        return changeable_copy(value)
    return copy.deepcopy(value)


@functools.cache
def _defaults(model_class: type[BaseModel]) -> dict[str, Any]:
    """Each field's default, built once per class: only compared with, never handed out or changed (a default
    factory's new list, dict or model on every write cost ~0.1 ms per turn write)."""
    return {name: field.get_default(call_default_factory=True) for name, field in model_class.model_fields.items()}


def _mark_changed(model: BaseModel) -> None:
    """Count as set every field whose value differs from its default, at every depth.

    ``exclude_unset`` only knows fields that were passed or assigned; a default list or dict changed in place (an
    appended steering input) would otherwise be left out of the write.
    """
    defaults = _defaults(type(model))
    fields_set = model.model_fields_set
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, _SCALARS):
            continue  # a scalar changes only by assignment or a copy's update, which count it as set
        if name not in fields_set and value != defaults[name]:
            fields_set.add(name)
        if isinstance(value, BaseModel):
            _mark_changed(value)
        elif isinstance(value, list):
            for item in value:  # pyright: ignore[reportUnknownVariableType]
                if isinstance(item, BaseModel):
                    _mark_changed(item)
