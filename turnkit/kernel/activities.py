"""TurnKit's activities as the workflows see them: each one's name, input and result, declared once.

A workflow calls an activity by method reference (``workflow.execute_activity_method(ModelCalls.model, call, …)``), so
the result type follows the call, and a reader follows it from the call to the declaration here and from there to
its implementation (in ``activities/``, which subclasses the declaring class and marks each method with
:func:`implements`). The declarations are bodiless, so workflow code that imports them loads no store, provider or
client code; the type checker holds each implementation to its declaration's signature (an override), and a test
holds the worker's registered activities to these names.

Strings name only the dynamic tool activity (``tool:<name>``, :data:`turnkit.kernel.names.TOOL_ACTIVITY_PREFIX`),
whose type varies with the tool.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity

from turnkit.kernel.asks import AskReceipt, AskTurn, ControlReceipt, ControlTurn, FollowAsk, TurnResult
from turnkit.kernel.payloads import (
    AuditCall,
    DelegateCalls,
    DelegateResult,
    DeliverBatch,
    DeliverResult,
    EndTurn,
    FinishTurn,
    FinishWait,
    JoinChildren,
    ModelCall,
    ModelStep,
    OpenedToolCall,
    SettleToolCall,
    StartTurn,
    SubmitTurn,
    ToolCallInput,
    ToolCallResult,
    ToolOutcome,
    TurnOutcome,
    TurnTicket,
    WaitPlan,
    WaitRequest,
)
from turnkit.kernel.requests import (
    CancelPlan,
    CancelRequest,
    CompactRequest,
    StandaloneEnd,
    StandaloneMedia,
    StandaloneOutcome,
)

__all__ = [
    "AskCalls",
    "ChildCalls",
    "DeliveryCalls",
    "LaneCalls",
    "ModelCalls",
    "RequestCalls",
    "ToolCalls",
    "TurnCalls",
    "activity_name",
    "declared_activities",
    "implements",
]

_F = TypeVar("_F", bound=Callable[..., Any])
_NAME = "__turnkit_activity__"


def _declare(name: str) -> Callable[[_F], _F]:
    """Declare an activity: Temporal's definition (name, argument and result types) on a bodiless method."""

    def decorate(fn: _F) -> _F:
        declared = activity.defn(name=name)(fn)
        setattr(declared, _NAME, name)
        return declared

    return decorate


def activity_name(declared: Callable[..., Any]) -> str:
    """The activity type a declared method is registered and scheduled under."""
    name = getattr(declared, _NAME, None)
    if name is None:
        raise TypeError(f"{getattr(declared, '__qualname__', declared)!r} is not a declared TurnKit activity")
    return name


def implements(declared: Callable[..., Any]) -> Callable[[_F], _F]:
    """Mark a method as the implementation of a declared activity: registered under the declaration's name."""
    name = activity_name(declared)

    def decorate(fn: _F) -> _F:
        return activity.defn(name=name)(fn)

    return decorate


class TurnCalls:
    """The turn record's writes that are not part of a model or tool call."""

    @_declare("turnkit.submit_turn")
    async def submit_turn(self, request: SubmitTurn) -> TurnTicket:
        """Append the trigger message and create the pending turn (idempotent by turn id); the lane's ``submit``."""
        raise NotImplementedError

    @_declare("turnkit.finish_turn")
    async def finish_turn(self, finish: FinishTurn) -> TurnOutcome:
        """Write a turn's terminal status the model activity did not write (a no-op on a finished turn)."""
        raise NotImplementedError

    @_declare("turnkit.settle_tool")
    async def settle_tool(self, settle: SettleToolCall) -> ToolOutcome:
        """Record a tool call whose activity was lost (``interrupted``) or finally failed; first writer wins."""
        raise NotImplementedError


class ModelCalls:
    """The model call of one iteration."""

    @_declare("turnkit.model")
    async def model(self, call: ModelCall) -> ModelStep:
        """Reserve the iteration, call the model, persist the response and its charge; the step the turn takes next."""
        raise NotImplementedError

    @_declare("turnkit.audit")
    async def audit(self, call: AuditCall) -> ModelStep:
        """The next step of a committed final answer's audit: one judge's call, committed with its charge (step
        ``audit``: call again), or, every judge answered, the constraints and the answer's publication."""
        raise NotImplementedError


class ToolCalls:
    """A tool call that runs as the application's own activity (``turnkit.activity_tool``): the store's side of it,
    before and after the workflow runs that activity."""

    @_declare("turnkit.open_tool")
    async def open_tool(self, request: ToolCallInput) -> OpenedToolCall:
        """Open the call's execution (budget, authorization, CAS to running) and return the activity's arguments."""
        raise NotImplementedError

    @_declare("turnkit.commit_tool")
    async def commit_tool(self, result: ToolCallResult) -> ToolOutcome:
        """Record what the call's activity returned as its result, with its tool-result message (once)."""
        raise NotImplementedError


class ChildCalls:
    """Sub-agents, ``launch_agent`` and ``wait_for``."""

    @_declare("turnkit.delegate")
    async def delegate(self, request: DelegateCalls) -> DelegateResult:
        """Record delegated calls and their child turns (idempotent); the children the workflow starts."""
        raise NotImplementedError

    @_declare("turnkit.join")
    async def join(self, request: JoinChildren) -> list[ToolOutcome]:
        """Settle delegated executions from their children and append every result, in call order."""
        raise NotImplementedError

    @_declare("turnkit.wait")
    async def wait(self, request: WaitRequest) -> WaitPlan:
        """The ``wait_for`` tool: record the wait edges (all or none), report the unfinished targets."""
        raise NotImplementedError

    @_declare("turnkit.finish_wait")
    async def finish_wait(self, request: FinishWait) -> ToolOutcome:
        """Complete a ``wait_for`` call with its targets' results, in the order asked."""
        raise NotImplementedError


class DeliveryCalls:
    """Deliveries reaching a lane."""

    @_declare("turnkit.deliver")
    async def deliver(self, batch: DeliverBatch) -> DeliverResult:
        """Append each pending delivery exactly once, then maybe wake the lane with a new turn."""
        raise NotImplementedError


class LaneCalls:
    """The lane's view of its turns."""

    @_declare("turnkit.lane_held")
    async def lane_held(self, conversation_id: str) -> bool:
        """Whether a turn the lane does not run (a sub-agent's) is still active in the conversation."""
        raise NotImplementedError

    @_declare("turnkit.start_turn")
    async def start_turn(self, start: StartTurn) -> bool:
        """Start the turn's workflow (workflow id = turn id); True if this call started it."""
        raise NotImplementedError

    @_declare("turnkit.end_turn")
    async def end_turn(self, end: EndTurn) -> TurnOutcome:
        """Record a turn whose workflow ended abnormally ``failed`` (a no-op on a terminal record)."""
        raise NotImplementedError

    @_declare("turnkit.follow_turn")
    async def follow_turn(self, end: EndTurn) -> bool:
        """Whether the turn has ended; if not, its end signals the lane from now on."""
        raise NotImplementedError


class AskCalls:
    """A team's workflow asking an agent (:mod:`turnkit.workflow`): submit, follow, control its turn."""

    @_declare("turnkit.ask_from_workflow")
    async def ask(self, request: AskTurn) -> AskReceipt:
        """Submit the turn as ``Conversation.ask`` does (idempotent by its ids) and make the workflow its waiter."""
        raise NotImplementedError

    @_declare("turnkit.follow_asked_turn")
    async def follow(self, follow: FollowAsk) -> TurnResult | None:
        """The turn's result once it has ended; None while it runs (its end signals the waiter)."""
        raise NotImplementedError

    @_declare("turnkit.control_asked_turn")
    async def control(self, control: ControlTurn) -> ControlReceipt:
        """Pause, resume, steer or cancel the turn, as ``Turn.pause`` … ``Turn.cancel`` do."""
        raise NotImplementedError


class RequestCalls:
    """The client's requests that run as workflows of their own (:mod:`turnkit.kernel.requests`): a cancel, a manual
    compaction, a standalone media call."""

    @_declare("turnkit.cancel_turns")
    async def cancel_turns(self, request: CancelRequest) -> CancelPlan:
        """Authorise, then end the turn (and its descendants, cascading) ``cancelled`` in one transaction."""
        raise NotImplementedError

    @_declare("turnkit.announce_cancel")
    async def announce_cancel(self, plan: CancelPlan) -> None:
        """Cancel the ended turns' workflows and tell their callbacks, waiters and lanes (idempotent)."""
        raise NotImplementedError

    @_declare("turnkit.compact")
    async def compact(self, request: CompactRequest) -> str:
        """Summarise the conversation's middle and append the summary under the request's message id (once)."""
        raise NotImplementedError

    @_declare("turnkit.standalone_media")
    async def standalone_media(self, request: StandaloneMedia) -> StandaloneOutcome:
        """Claim the prepared turn, paint or view media, record the answer and end the turn (one claim per request)."""
        raise NotImplementedError

    @_declare("turnkit.end_standalone")
    async def end_standalone(self, end: StandaloneEnd) -> StandaloneOutcome:
        """Record the turn ``failed`` when its standalone call's attempts ran out (a no-op on a terminal turn)."""
        raise NotImplementedError


def declared_activities() -> dict[str, Callable[..., Any]]:
    """Every declared activity by name (a worker registers an implementation of each)."""
    declared: dict[str, Callable[..., Any]] = {}
    for calls in (TurnCalls, ModelCalls, ToolCalls, ChildCalls, DeliveryCalls, LaneCalls, AskCalls, RequestCalls):
        for member in vars(calls).values():
            name = getattr(member, _NAME, None)
            if name is not None:
                declared[name] = member
    return declared
