"""``TurnWorkflow``: one TurnKit turn, the model → tools → model loop (behaviour §3.2).

Temporal owns where the turn is; the store owns what it said. Each iteration is one ``turnkit.model`` activity
(reserve the iteration, call the model, persist the response) followed by one activity per tool call, named
``tool:<name>``, with the retry policy of the tool's recovery mode; a tool declared ``local=True`` runs as a local
activity inside the workflow task (docs/design.md, "Local tool calls"). Payloads carry ids, never the transcript.

A long turn continues as new at the top of an iteration when Temporal suggests it, carrying what the workflow keeps
in memory in its ``TurnInput``; everything else is in the store.

Seeing it run: the current details say where the turn is (iteration, model, tool, waiting on whom); a turn started
with TurnKit's search attributes keeps ``TurnKitTurnStatus`` current and starts its sub-agents with theirs (see
:mod:`turnkit.kernel.search_attributes`).

Workflow code imports :mod:`turnkit.kernel` and nothing else of TurnKit: it decides from its input and the activities'
results, never from the agent registry or the settings, so a turn in flight replays as it ran after either changes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, ChildWorkflowError, RetryState
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.workflow import ChildWorkflowCancellationType, ChildWorkflowHandle, ParentClosePolicy

from turnkit._workflows.store_calls import LOCAL_RETRY, STORE_RETRY, STORE_TIMEOUT, local_failure, store_call
from turnkit.kernel.activities import ChildCalls, LaneCalls, ModelCalls, ToolCalls, TurnCalls
from turnkit.kernel.failures import (
    MODEL_NON_RETRYABLE,
    TIMED_OUT,
    TOOL_RAISED,
    ended_reason,
    failure_of,
    final_model_failure,
)
from turnkit.kernel.metrics import tool_executed, turn_finished
from turnkit.kernel.names import RESUME_SIGNAL, TARGET_FINISHED_SIGNAL, TOOL_ACTIVITY_PREFIX, TURN_WORKFLOW
from turnkit.kernel.payloads import (
    ActivityTarget,
    AuditCall,
    CallPolicy,
    DelegateCalls,
    DelegateResult,
    EndTurn,
    FinishTurn,
    FinishWait,
    JoinChildren,
    ModelCall,
    ModelStep,
    SettleToolCall,
    ToolCallInput,
    ToolCallRef,
    ToolCallResult,
    ToolOutcome,
    TurnInput,
    TurnOutcome,
    WaitRequest,
)
from turnkit.kernel.records import CANCELLED_CLASS, CANCELLED_MESSAGE, INTERRUPTED_MESSAGE, OPEN_EXECUTION_STATUSES
from turnkit.kernel.search_attributes import TURN_STATUS, has_turnkit_attributes, turn_search_attributes

__all__ = ["TurnWorkflow"]

#: Time left to the deadline below which a capped activity is not scheduled: the deadline has passed (the timer's
#: own floor, as ``_run`` starts it).
_DEADLINE_FLOOR = timedelta(milliseconds=1)


class _DeadlinePassed(Exception):
    """Raised out of the loop where the deadline ends the turn without a timer: a capped activity cut short by its
    cap, or the deadline passed before one was scheduled. ``_run`` ends the turn as when the timer fires."""


@dataclass(frozen=True)
class _Bound:
    """The schedule-to-close timeout of a capped activity, and whether the deadline is what sets it."""

    schedule_to_close: timedelta | None
    by_deadline: bool


@dataclass(frozen=True)
class _LocalFailure:
    """A failed local attempt: what failed it (the SDK raises an attempt's own failure, wrapped only on a timeout) and
    what the SDK raised."""

    failure: BaseException | None
    error: Exception


@workflow.defn(name=TURN_WORKFLOW)
class TurnWorkflow:
    """Runs one turn to a terminal status and returns a small :class:`TurnOutcome`."""

    def __init__(self) -> None:
        self._cancelled = False
        self._resumes = 0  # resume signals received
        self._resume_mark = 0  # resume signals seen before the last store call
        self._finished: dict[str, None] = {}  # targets that signalled their end (an ordered set)
        self._children: dict[str, ChildWorkflowHandle[Any, Any]] = {}  # launched children, by turn id
        self._launched: list[str] = []  # children launched by earlier runs (before continue-as-new)
        self._search = False  # keep the search attributes current (set when run() starts)
        self._status = "running"  # the TurnKitTurnStatus value last set
        self._iteration = 0  # for the current details
        self._capping = False  # the deadline is enforced by capping activities (no timer yet): see _run
        self._capped = 0  # capped activities awaited right now (0 or 1: the loop runs one call at a time)

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnOutcome:
        # What an earlier run of this turn carried over (all empty for a new turn); signals may have landed already.
        self._resumes += turn.resumes
        self._resume_mark = turn.resumes
        self._finished = {**dict.fromkeys(turn.finished_turn_ids), **self._finished}
        self._launched = list(turn.launched_turn_ids)
        self._iteration = turn.iteration
        attributes = workflow.info().typed_search_attributes
        # Upserts only when the start carried TurnKit's attributes: then the namespace has them (never a wedge).
        self._search = has_turnkit_attributes(attributes)
        self._status = attributes.get(TURN_STATUS) or "running"
        self._details("starting")
        ended = await self._run(turn)
        if isinstance(ended, TurnInput):
            self._details("continuing as new")
            workflow.continue_as_new(ended)
        self._set_status(ended.status)
        # Recorded where the turn's end reaches Temporal: once per turn, not again on replay (kernel.metrics).
        turn_finished(workflow.metric_meter(), agent=turn.agent_name, status=ended.status)
        details = ended.status if ended.error_class is None else f"{ended.status} · {ended.error_class}"
        workflow.set_current_details(f"{details} after {_count(self._iteration, 'iteration')}")
        return ended

    def _set_status(self, status: str) -> None:
        """Keep ``TurnKitTurnStatus`` current (one upsert per change, only with proof of registration)."""
        if status == self._status:
            return
        self._status = status
        if self._search:
            workflow.upsert_search_attributes([TURN_STATUS.value_set(status)])

    def _details(self, doing: str) -> None:
        """The current details shown in the UI: where the turn is."""
        workflow.set_current_details(f"iteration {self._iteration} · {doing}")

    async def _run(self, turn: TurnInput) -> TurnOutcome | TurnInput:
        loop = asyncio.create_task(self._loop(turn))
        try:
            if turn.deadline is None:
                return await loop
            if turn.deadline_without_timer:
                # No timer (a billable action) while the loop only awaits activities capped at the time left (its
                # model and tool calls: _bound): each ends by the deadline on its own. The timer starts at the first
                # wait of any other kind (sub-agents, a pause, a wait on targets, a local activity, a store call, a
                # sleep), for the rest of the turn. Conditions are checked once every ready task has run, so the
                # predicate sees where the loop is blocked, never a step between two calls.
                self._capping = True
                await workflow.wait_condition(lambda: loop.done() or self._capped == 0)
                self._capping = False
                if loop.done():
                    return await self._ended(turn, loop)
            remaining = (turn.deadline - workflow.now()).total_seconds()
            try:
                # The root deadline covers the whole loop, including calls in flight and waits (behaviour §5.12).
                await workflow.wait_condition(loop.done, timeout=max(remaining, 0.001), timeout_summary="turn deadline")
            except TimeoutError:  # wait_condition timed out (asyncio.TimeoutError is TimeoutError)
                loop.cancel()
                try:
                    return await loop
                except asyncio.CancelledError:
                    return await self._time_out(turn)
            return loop.result()
        except asyncio.CancelledError:
            # Cancelled by the application (turn.cancel): the record already says so; write nothing more.
            self._cancelled = True
            loop.cancel()
            with suppress(BaseException):
                await loop  # let the loop unwind (its calls are cancelled) before this workflow completes
            return TurnOutcome(
                turn_id=turn.turn_id,
                status="cancelled",
                error_class=CANCELLED_CLASS,
                error_message=CANCELLED_MESSAGE,
            )

    async def _ended(self, turn: TurnInput, loop: asyncio.Task[TurnOutcome | TurnInput]) -> TurnOutcome | TurnInput:
        """What the loop ended with, while no timer ran: its outcome, or the deadline's end of the turn when a capped
        activity's cap ended it. A retry the cap left no room for ends it before the deadline: the turn waits for
        the deadline (a timer, in that case only), then ends as the timer would have ended it."""
        try:
            return loop.result()
        except _DeadlinePassed:
            assert turn.deadline is not None  # capped only with a deadline
            left = (turn.deadline - workflow.now()).total_seconds()
            if left > 0:
                await workflow.sleep(left, summary="turn deadline")
            return await self._time_out(turn)

    def _bound(self, turn: TurnInput, own: timedelta | None = None) -> _Bound:
        """The schedule-to-close timeout of a capped activity (a model or tool call): ``own`` (its own, if any) cut
        to the time left to the deadline while ``_run`` runs no timer; raises ``_DeadlinePassed`` when the deadline
        has passed. With the timer running (or no deadline), ``own`` unchanged: the commands an older turn recorded."""
        if not self._capping or turn.deadline is None:
            return _Bound(own, by_deadline=False)
        left = turn.deadline - workflow.now()
        if left < _DEADLINE_FLOOR:
            raise _DeadlinePassed
        if own is not None and own <= left:
            return _Bound(own, by_deadline=False)
        return _Bound(left, by_deadline=True)

    def _raise_if_cut_short(self, turn: TurnInput, bound: _Bound, err: ActivityError) -> None:
        """A capped activity the deadline ended (its cap timed it out, or left no room for another attempt) ends the
        turn as the timer would: not settled as a failed call, and no model call after it."""
        if not bound.by_deadline or turn.deadline is None:
            return
        timed_out = isinstance(err.cause, ActivityTimeoutError) and workflow.now() >= turn.deadline
        if timed_out or err.retry_state == RetryState.TIMEOUT:
            raise _DeadlinePassed from err

    async def _capped_call(self, call: Awaitable[Any]) -> Any:
        """Await a capped activity, counted for ``_run``'s wait: the deadline needs no timer while it runs."""
        self._capped += 1
        try:
            return await call
        finally:
            self._capped -= 1

    async def _time_out(self, turn: TurnInput) -> TurnOutcome:
        """The root deadline passed (the loop is cancelled): fail the turn "turn timed out", unless the store says it
        is paused (at a boundary, or paused while it waited): then wait for a resume and fail it then, since only a
        resume or a cancellation takes a turn out of ``paused`` (behaviour §5.13 invariant 11). The store decides: a
        turn paused while it waits on sub-agents is paused there, not in this workflow."""
        while True:
            mark = self._resumes  # a resume landing while the store is read counts
            finish = FinishTurn(
                turn_id=turn.turn_id,
                status="failed",
                error_class="TurnKit::BudgetError",
                error_message=TIMED_OUT,
                unless_paused=True,
            )
            ended = await self._finish_with(finish)
            if not ended.paused:
                return ended
            self._set_status("paused")
            self._details("paused past the deadline · waiting for resume")
            await workflow.wait_condition(lambda mark=mark: self._resumes > mark)

    async def _loop(self, turn: TurnInput) -> TurnOutcome | TurnInput:
        iteration = turn.iteration
        while True:
            if workflow.info().is_continue_as_new_suggested():
                # Between iterations nothing is in flight: let signal handlers land, then carry the memory over.
                await workflow.wait_condition(workflow.all_handlers_finished)
                return self._carry(turn, iteration)
            iteration += 1
            self._iteration = iteration
            self._details(f"model · {turn.agent_name}")
            step = await self._model(turn, iteration)
            if isinstance(step, TurnOutcome):
                return step
            match step.outcome:
                case "waiting":
                    # Application-level waits (docs/design.md "Waits"): nothing reserved yet; wait, then ask again.
                    await self._wait_for_targets(step.waiting_on)
                    iteration -= 1
                case "paused":
                    await self._wait_for_resume()
                case "steered":
                    pass  # the steering input is in the transcript: ask the model again
                case "stopped":
                    return TurnOutcome(turn_id=turn.turn_id, status="cancelled")
                case "budget_exceeded":
                    return await self._finish(turn, "failed", "TurnKit::BudgetError", step.budget_error or "")
                case "completed":  # the step brings the answer's start, for the UI (never the whole answer)
                    return TurnOutcome(turn_id=turn.turn_id, status="completed", output_preview=step.output_preview)
                case "failed":  # recorded by the activity (an output audit in fail mode): no command to add
                    return TurnOutcome(
                        turn_id=turn.turn_id,
                        status="failed",
                        error_class=step.error_class,
                        error_message=step.error_message,
                    )
                case "tools":
                    ended = await self._dispatch(turn, step.tool_calls)
                    if ended is not None:
                        return ended
                case "audit":
                    pass  # never here: _model carries an answer through its audit before it returns

    def _carry(self, turn: TurnInput, iteration: int) -> TurnInput:
        """The next run's input. Children launched before cannot be awaited as children there: the next run waits
        for them through their wait rows and ``target_finished`` signals, like any other turn."""
        return turn.model_copy(
            update={
                "iteration": iteration,
                "resumes": self._resumes,
                "finished_turn_ids": list(self._finished),
                "launched_turn_ids": [*self._launched, *self._children],
            }
        )

    async def _dispatch(self, turn: TurnInput, calls: list[ToolCallRef]) -> TurnOutcome | None:
        """Run the calls in proposal order; consecutive sub-agent calls fan out in parallel (behaviour §3.8)."""
        kinds = [_policy_of(call).kind for call in calls]
        index = 0
        while index < len(calls):
            call = calls[index]
            if kinds[index] == "sub_agent":
                group = [call]
                while index + len(group) < len(calls) and kinds[index + len(group)] == "sub_agent":
                    group.append(calls[index + len(group)])
                delegated = await self._delegate(turn, group)
                if delegated.boundary == "paused":
                    await self._wait_for_resume()
                    continue  # the same group again: its boundary is checked anew
                if delegated.boundary == "steered":
                    return None  # superseded by human steering: back to the model
                if delegated.budget_error:
                    return await self._finish(turn, "failed", "TurnKit::BudgetError", delegated.budget_error)
                index += len(group)
                continue
            if kinds[index] == "launch_agent":
                outcome = await self._launch(turn, call)
            elif kinds[index] == "wait_for":
                outcome = await self._wait_tool(turn, call)
            elif kinds[index] == "activity":
                outcome = await self._activity_tool(turn, call)
            else:
                outcome = await self._tool(turn, call)
            if outcome.status not in OPEN_EXECUTION_STATUSES:  # settled (not a boundary that asks again)
                tool_executed(workflow.metric_meter(), tool=call.name, status=outcome.status)
            match outcome.outcome:
                case "stopped":
                    return TurnOutcome(turn_id=turn.turn_id, status="cancelled")
                case "paused":
                    await self._wait_for_resume()
                    continue  # the same call again: its boundary is checked anew
                case "steered":
                    return None  # the remaining proposals were superseded: back to the model
                case "budget_exceeded":
                    return await self._finish(turn, "failed", "TurnKit::BudgetError", outcome.budget_error or "")
                case "terminal":
                    finish = FinishTurn(
                        turn_id=turn.turn_id,
                        status="completed",
                        terminal_execution_id=outcome.execution_id,
                        skipped_calls=calls[index + 1 :],
                        judge_apart=True,  # one judge call per finish: see _model's audit_apart (no patch either)
                    )
                    # The finish audits the terminal answer (behaviour §3.9) and may call output-policy
                    # judges: it may take as long as a model call, at least.
                    timeout = max(STORE_TIMEOUT, timedelta(seconds=turn.model_policy.timeout))
                    self._resume_mark = self._resumes  # the finish passes a control boundary
                    heartbeat = timedelta(seconds=turn.model_policy.heartbeat)
                    ended = await self._finish_with(finish, timeout=timeout, heartbeat=heartbeat)
                    while ended.judged:  # a judge's answer and charge committed, more to ask: finish again
                        ended = await self._finish_with(finish, timeout=timeout, heartbeat=heartbeat)
                    if ended.boundary == "paused":
                        await self._wait_for_resume()
                        return None  # resumed: the model activity's boundary publishes the held answer
                    if ended.revised or ended.boundary == "steered":
                        return None  # a revision request or steering is the model's next input
                    return ended
                case "done":
                    index += 1
        return None

    async def _delegate(self, turn: TurnInput, group: list[ToolCallRef]) -> DelegateResult:
        """Run a group of sub-agent calls as parallel child turns; their results are appended in call order."""
        self._resume_mark = self._resumes
        plan = await store_call(
            ChildCalls.delegate,
            _delegation(turn, group, launch=False),
            summary=f"delegate · {', '.join(c.name for c in group)}",
        )
        if plan.boundary is not None:
            return plan
        # ABANDON: cancelling this turn alone (descendants="retain") leaves its children running; a cascading
        # cancel cancels each of them explicitly.
        children = [
            await workflow.start_child_workflow(
                TurnWorkflow.run,
                p.child,
                id=p.child.turn_id,
                static_summary=f"sub-agent · {p.child.agent_name}",
                cancellation_type=ChildWorkflowCancellationType.ABANDON,
                parent_close_policy=ParentClosePolicy.ABANDON,
                search_attributes=self._child_attributes(turn, p.child),
            )
            for p in plan.plans
            if p.child is not None
        ]
        if children:
            self._set_status("waiting")
            names = ", ".join(c.name for c in group)
            self._details(f"waiting on {_count(len(children), 'sub-agent')}: {names}")
        # A failed or cancelled child is a structured result for the parent, never an exception.
        ends = await asyncio.gather(*children, return_exceptions=True)
        self._set_status("running")
        self._details("sub-agents done")
        lost = [(c.id, e) for c, e in zip(children, ends, strict=True) if isinstance(e, ChildWorkflowError)]
        # A child whose workflow ended abnormally (terminated, timed out) gets a terminal record before the join, so
        # its result is structured and its record never stays `running`.
        for child_id, err in lost:
            await store_call(
                LaneCalls.end_turn,
                EndTurn(turn_id=child_id, reason=ended_reason(err.cause)),
                summary="record abnormal end",
            )
        await store_call(
            ChildCalls.join,
            JoinChildren(
                turn_id=turn.turn_id,
                root_turn_id=turn.root_turn_id,
                execution_ids=[p.execution_id for p in plan.plans],
            ),
            summary="join sub-agents",
        )
        return plan

    async def _launch(self, turn: TurnInput, call: ToolCallRef) -> ToolOutcome:
        """``launch_agent``: record the child and start it abandoned (it outlives this turn); return at once."""
        self._resume_mark = self._resumes
        plan = await store_call(ChildCalls.delegate, _delegation(turn, [call], launch=True), summary="launch_agent")
        if plan.boundary is not None:
            return ToolOutcome(outcome=plan.boundary)
        [launched] = plan.plans
        if launched.child is not None:
            handle = await workflow.start_child_workflow(
                TurnWorkflow.run,
                launched.child,
                id=launched.child.turn_id,
                parent_close_policy=ParentClosePolicy.ABANDON,
                static_summary=f"launched · {launched.child.agent_name}",
                search_attributes=self._child_attributes(turn, launched.child),
            )
            self._children[launched.child.turn_id] = handle
        return ToolOutcome(
            outcome="budget_exceeded" if plan.budget_error else "done",
            execution_id=launched.execution_id,
            status="completed",
            budget_error=plan.budget_error,
        )

    async def _wait_tool(self, turn: TurnInput, call: ToolCallRef) -> ToolOutcome:
        """``wait_for``: wait rows in the store, woken by the targets' signals (or awaits on our own children)."""
        plan = await store_call(
            ChildCalls.wait,
            WaitRequest(turn_id=turn.turn_id, root_turn_id=turn.root_turn_id, call=call),
            summary="wait_for",
        )
        if plan.settled:
            return ToolOutcome(outcome="done", execution_id=plan.execution_id, status="failed")
        await self._wait_for_targets(plan.unfinished_ids)
        return await store_call(
            ChildCalls.finish_wait,
            FinishWait(turn_id=turn.turn_id, root_turn_id=turn.root_turn_id, execution_id=plan.execution_id),
            summary="wait_for · done",
        )

    def _child_attributes(self, turn: TurnInput, child: TurnInput) -> TypedSearchAttributes | None:
        """A sub-agent's search attributes (None unless this turn keeps its own: proven registered)."""
        if not self._search:
            return None
        return turn_search_attributes(
            conversation_id=child.conversation_id,
            agent_name=child.agent_name,
            root_turn_id=child.root_turn_id,
            parent_turn_id=turn.turn_id,
        )

    async def _wait_for_targets(self, target_ids: list[str]) -> None:
        own = [self._children[t] for t in target_ids if t in self._children]
        others = [t for t in target_ids if t not in self._children]
        if own or not all(t in self._finished for t in others):
            self._set_status("waiting")
            self._details(f"waiting on {_count(len(target_ids), 'turn')}")
        if own:
            await asyncio.gather(*own, return_exceptions=True)  # our own children: child-workflow awaits
        await workflow.wait_condition(lambda: all(t in self._finished for t in others))
        self._set_status("running")

    @workflow.signal(name=RESUME_SIGNAL)
    def resume(self) -> None:
        """The application resumed this turn (the store says so already): re-check at the boundary."""
        self._resumes += 1

    async def _wait_for_resume(self) -> None:
        # A resume that arrived while the store call ran counts: the call is simply re-checked at once.
        mark = self._resume_mark
        if self._resumes <= mark:
            self._set_status("paused")
            self._details("paused · waiting for resume")
        await workflow.wait_condition(lambda: self._resumes > mark)
        self._set_status("running")

    @workflow.signal(name=TARGET_FINISHED_SIGNAL)
    def target_finished(self, turn_id: str) -> None:
        """A turn this one waits on has ended (sent by the target after its terminal write)."""
        self._finished[turn_id] = None

    def _raise_if_cancelled(self, err: ActivityError) -> None:
        """A call cancelled with the turn is not a failure to record: unwind instead."""
        if self._cancelled or isinstance(err.cause, CancelledError):
            raise asyncio.CancelledError() from err

    async def _model(self, turn: TurnInput, iteration: int) -> ModelStep | TurnOutcome:
        self._resume_mark = self._resumes
        call = ModelCall(
            turn_id=turn.turn_id,
            root_turn_id=turn.root_turn_id,
            request_id=str(workflow.uuid4()),
            iteration=iteration,
            # The activity commits a final answer before its audit and says "audit" (docs/design.md, "Every paid
            # call once"). Only this input changes: recorded steps never say "audit", so no history replays
            # differently, and an activity scheduled by an older workflow audits inline, as that workflow expects.
            audit_apart=True,
        )
        step = await self._model_call(turn, call)
        if isinstance(step, ModelStep) and step.outcome == "audit":
            return await self._audit(turn, call)
        return step

    async def _audit(self, turn: TurnInput, call: ModelCall) -> ModelStep | TurnOutcome:
        """The committed answer's audit: one ``turnkit.audit`` activity per judge call (each commits its answer and
        charge), the last one publishing the answer; the step the turn takes next."""
        policy = turn.model_policy
        audit = AuditCall(turn_id=call.turn_id, root_turn_id=call.root_turn_id, request_id=call.request_id)
        while True:
            self._resume_mark = self._resumes  # the publication passes a control boundary
            self._details("output audit")
            try:
                step = await workflow.execute_activity_method(
                    ModelCalls.audit,
                    audit,
                    start_to_close_timeout=timedelta(seconds=policy.timeout),
                    heartbeat_timeout=timedelta(seconds=policy.heartbeat),
                    retry_policy=_model_retries(policy.max_attempts),
                    summary=f"output audit · {turn.agent_name} · iteration {call.iteration}",
                )
            except ActivityError as err:
                self._raise_if_cancelled(err)
                error_class, message = failure_of(err.cause, err)
                return await self._finish(turn, "failed", error_class, message)
            if step.outcome != "audit":
                return step

    async def _model_call(self, turn: TurnInput, call: ModelCall) -> ModelStep | TurnOutcome:
        policy = turn.model_policy
        attempts = policy.max_attempts
        summary = f"model · {turn.agent_name} · iteration {call.iteration}"
        if policy.local:
            # settings.model_local_activity: the first attempt runs in this worker, inside this workflow task, so the
            # step it returns needs no workflow task of its own (docs/design.md, "Local model calls").
            step = await self._local_attempt(
                ModelCalls.model, call, timedelta(seconds=policy.timeout), f"{summary} · local"
            )
            if not isinstance(step, _LocalFailure):
                return step
            failure = step.failure
            if attempts == 1 or final_model_failure(failure):  # 0 attempts: unlimited, as Temporal reads it
                error_class, message = failure_of(failure, step.error)
                return await self._finish(turn, "failed", error_class, message)
            if isinstance(failure, ApplicationError) and failure.next_retry_delay:
                await workflow.sleep(failure.next_retry_delay)  # the provider's retry-after, as a retry would
            # The remaining attempts run as a regular activity, with the same request id: a response the local
            # attempt committed is found, not asked for again.
            call = call.model_copy(update={"attempts_before": 1})
            attempts = max(attempts - 1, 0)  # 0 stays 0: unlimited
        bound = self._bound(turn)
        try:
            return await self._capped_call(
                workflow.execute_activity_method(
                    ModelCalls.model,
                    call,
                    start_to_close_timeout=timedelta(seconds=policy.timeout),
                    schedule_to_close_timeout=bound.schedule_to_close,
                    heartbeat_timeout=timedelta(seconds=policy.heartbeat),
                    retry_policy=_model_retries(attempts),
                    summary=summary,
                )
            )
        except ActivityError as err:
            self._raise_if_cancelled(err)
            self._raise_if_cut_short(turn, bound, err)
            error_class, message = failure_of(err.cause, err)
            return await self._finish(turn, "failed", error_class, message)

    async def _tool(self, turn: TurnInput, call: ToolCallRef) -> ToolOutcome:
        self._resume_mark = self._resumes
        self._details(f"tool {call.name}")
        policy = _policy_of(call)
        timeout, heartbeat, retry = _tool_policy(policy)
        request = ToolCallInput(
            turn_id=turn.turn_id,
            conversation_id=turn.conversation_id,
            root_turn_id=turn.root_turn_id,
            agent_name=turn.agent_name,
            call=call,
        )
        if policy.local:
            # @tool(local=True): the first attempt runs in this worker, inside this workflow task, so its result and
            # the next model call need no workflow task of their own (docs/design.md, "Local tool calls").
            outcome = await self._local_tool_attempt(request, timeout)
            if not isinstance(outcome, _LocalFailure):
                return outcome
            if policy.at_most_once or policy.max_attempts <= 1:
                return await self._settle_failed(turn, call, policy, outcome.failure)
            # A replay-safe call's remaining attempts run as a regular activity: the same execution and key.
            request = request.model_copy(update={"attempts_before": 1})
            retry = _retries(policy, policy.max_attempts - 1)
        bound = self._bound(turn)
        try:
            return await self._capped_call(
                workflow.execute_activity(
                    f"{TOOL_ACTIVITY_PREFIX}{call.name}",
                    request,
                    result_type=ToolOutcome,
                    start_to_close_timeout=timeout,
                    schedule_to_close_timeout=bound.schedule_to_close,
                    heartbeat_timeout=heartbeat,
                    retry_policy=retry,
                    task_queue=policy.task_queue,  # the tool's own queue (a GPU box); None: this turn's queue
                    summary=f"tool {call.name}",
                )
            )
        except ActivityError as err:
            self._raise_if_cancelled(err)
            self._raise_if_cut_short(turn, bound, err)
            return await self._settle_failed(turn, call, policy, err.cause)

    async def _activity_tool(self, turn: TurnInput, call: ToolCallRef) -> ToolOutcome:
        """A call that runs as the application's own activity (``turnkit.activity_tool``): the store opens its
        execution and gives its arguments, the activity runs on its own queue with its own timeouts and retries, and
        the store records what it returned. Its arguments and result are in this history (docs/design.md)."""
        self._resume_mark = self._resumes  # the open passes a control boundary
        self._details(f"tool {call.name}")
        policy = _policy_of(call)
        target = policy.activity
        assert target is not None  # kind "activity" always names its activity
        request = ToolCallInput(
            turn_id=turn.turn_id,
            conversation_id=turn.conversation_id,
            root_turn_id=turn.root_turn_id,
            agent_name=turn.agent_name,
            call=call,
        )
        opened = await store_call(ToolCalls.open_tool, request, summary=f"open {call.name}")
        if opened.ended is not None:
            return opened.ended
        # The open above is a store call, so the deadline's timer runs by now; capped all the same, should that change.
        bound = self._bound(turn, _seconds(target.schedule_to_close))
        try:
            result = await self._capped_call(
                workflow.execute_activity(
                    target.activity_type,
                    args=opened.args,
                    task_queue=policy.task_queue,  # the team's queue; None: this turn's
                    start_to_close_timeout=timedelta(seconds=policy.timeout),
                    schedule_to_close_timeout=bound.schedule_to_close,
                    heartbeat_timeout=_seconds(target.heartbeat),
                    retry_policy=_activity_retries(policy, target),
                    summary=f"tool {call.name}",
                )
            )
        except ActivityError as err:
            self._raise_if_cancelled(err)
            self._raise_if_cut_short(turn, bound, err)
            return await self._settle_failed(turn, call, policy, err.cause)
        done = ToolCallResult(request=request, execution_id=opened.execution_id, result=result)
        return await store_call(ToolCalls.commit_tool, done, summary=f"record {call.name}")

    async def _local_attempt(
        self,
        declared: Callable[[Any, ModelCall], Awaitable[ModelStep]],
        call: ModelCall,
        timeout: timedelta,
        summary: str,
    ) -> ModelStep | _LocalFailure:
        """One attempt of the model call as a local activity, in this workflow task (``LOCAL_RETRY``: the SDK's local
        retries are unreliable, see store_calls): its step, or what failed it. A cancelled turn unwinds instead."""
        try:
            return await workflow.execute_local_activity_method(
                declared, call, start_to_close_timeout=timeout, retry_policy=LOCAL_RETRY, summary=summary
            )
        except Exception as err:
            return self._local_failure(err)

    async def _local_tool_attempt(self, request: ToolCallInput, timeout: timedelta) -> ToolOutcome | _LocalFailure:
        """One attempt of a tool call as a local activity, in this workflow task: its outcome, or what failed it."""
        try:
            return await workflow.execute_local_activity(
                f"{TOOL_ACTIVITY_PREFIX}{request.call.name}",
                request,
                result_type=ToolOutcome,
                start_to_close_timeout=timeout,
                retry_policy=LOCAL_RETRY,
                summary=f"tool {request.call.name} · local",
            )
        except Exception as err:
            return self._local_failure(err)

    def _local_failure(self, err: Exception) -> _LocalFailure:
        failure = local_failure(err)
        if self._cancelled or isinstance(failure, CancelledError):
            raise asyncio.CancelledError() from err
        return _LocalFailure(failure, err)

    async def _settle_failed(
        self, turn: TurnInput, call: ToolCallRef, policy: CallPolicy, failure: BaseException | None
    ) -> ToolOutcome:
        """Record a call whose last attempt failed or was lost (worker died, timed out); never re-run an at-most-once
        tool. A lost attempt's outcome is unknown; the model is told so (behaviour §5.8)."""
        lost = isinstance(failure, ActivityTimeoutError)
        if not lost and policy.at_most_once:
            # Only the tool raising is a known outcome; any other failure of the attempt (the store, the worker) may
            # have come after the body ran, so it is "interrupted", never "failed". The application's own activity
            # raised when its failure is an application error (it records nothing of TurnKit's after its body).
            raised = isinstance(failure, ApplicationError) and (
                policy.kind == "activity" or failure.type == TOOL_RAISED
            )
            lost = not raised
        settle = SettleToolCall(
            turn_id=turn.turn_id,
            conversation_id=turn.conversation_id,
            call=call,
            outcome="interrupted" if lost else "failed",
            message=INTERRUPTED_MESSAGE if lost else failure_of(failure)[1],
        )
        return await store_call(TurnCalls.settle_tool, settle, summary=f"settle {call.name}")

    async def _finish(self, turn: TurnInput, status: str, error_class: str, message: str) -> TurnOutcome:
        finish = FinishTurn(turn_id=turn.turn_id, status=status, error_class=error_class, error_message=message)  # type: ignore[arg-type]
        return await self._finish_with(finish)

    async def _finish_with(
        self, finish: FinishTurn, *, timeout: timedelta | None = None, heartbeat: timedelta | None = None
    ) -> TurnOutcome:
        summary = f"finish · {finish.status}"
        if timeout is None:
            return await store_call(TurnCalls.finish_turn, finish, summary=summary)
        # A terminal answer's finish may call output-policy judges (model calls): a regular activity, as long as a
        # model call may take, never the local fast path.
        return await workflow.execute_activity_method(
            TurnCalls.finish_turn,
            finish,
            start_to_close_timeout=timeout,
            heartbeat_timeout=heartbeat,  # a killed worker's attempt retried in seconds, not at the timeout
            retry_policy=STORE_RETRY,
            summary=summary,
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _delegation(turn: TurnInput, calls: list[ToolCallRef], *, launch: bool) -> DelegateCalls:
    return DelegateCalls(
        turn_id=turn.turn_id,
        root_turn_id=turn.root_turn_id,
        agent_name=turn.agent_name,
        depth=turn.depth,
        deadline=turn.deadline,
        calls=calls,
        launch=launch,
    )


def _policy_of(call: ToolCallRef) -> CallPolicy:
    """How to dispatch ``call``, as the model activity resolved it (travelling in the step, so a replay decides as the
    run did); a ref without one is an unknown tool's."""
    return call.policy or CallPolicy(kind="unknown")


def _tool_policy(policy: CallPolicy) -> tuple[timedelta, timedelta, RetryPolicy]:
    """Timeouts and retries of one tool call, from its recovery mode."""
    if policy.kind == "unknown":  # unknown tool: the activity records the failure at once
        return timedelta(seconds=30), timedelta(seconds=30), RetryPolicy(maximum_attempts=1)
    timeout = timedelta(seconds=policy.timeout)
    heartbeat = timedelta(seconds=policy.heartbeat)
    # At most once: one attempt; a lost one is "interrupted", never re-run.
    retry = RetryPolicy(maximum_attempts=1) if policy.at_most_once else _retries(policy, policy.max_attempts)
    return timeout, heartbeat, retry


def _seconds(seconds: float | None) -> timedelta | None:
    return None if seconds is None else timedelta(seconds=seconds)


def _activity_retries(policy: CallPolicy, target: ActivityTarget) -> RetryPolicy:
    """The retry policy of an application's activity run as a tool: one attempt at most once (a lost one is
    "interrupted", never re-run), else the activity tool's own."""
    if policy.at_most_once:
        return RetryPolicy(maximum_attempts=1)
    return RetryPolicy(
        initial_interval=timedelta(seconds=policy.initial_retry_interval),
        backoff_coefficient=target.backoff_coefficient,
        maximum_interval=timedelta(seconds=policy.maximum_retry_interval),
        maximum_attempts=policy.max_attempts,
        non_retryable_error_types=target.non_retryable_error_types or None,
    )


def _retries(policy: CallPolicy, attempts: int) -> RetryPolicy:
    """A replay-safe tool's retry policy, for ``attempts`` attempts."""
    return RetryPolicy(
        initial_interval=timedelta(seconds=policy.initial_retry_interval),
        maximum_interval=timedelta(seconds=policy.maximum_retry_interval),
        maximum_attempts=attempts,
    )


def _model_retries(attempts: int) -> RetryPolicy:
    """The retry policy of a model call and of an output audit (both ask a provider): ``attempts`` (0: unlimited)."""
    return RetryPolicy(
        initial_interval=timedelta(seconds=1),
        maximum_interval=timedelta(seconds=30),
        maximum_attempts=attempts,
        non_retryable_error_types=list(MODEL_NON_RETRYABLE),
    )
