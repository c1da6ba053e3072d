"""Turn record activities: submission (lane), terminal writes, and settling a lost tool call.

Each is one transaction and idempotent: a retry finds what the first attempt committed and returns it.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnkit._activities.judges import answered_audit, judge_next
from turnkit._activities.notify import announce_terminal
from turnkit._activities.output_audit import (
    AnswerAudit,
    announce_audit_in,
    audit_terminal_answer,
    charge_judges,
    publication,
    record_audit,
)
from turnkit._activities.tools import find_tool
from turnkit._activities.tools import outcome_of as outcome_of_execution
from turnkit._engine.charges import tree_spend_denial
from turnkit._engine.controls import control_boundary, has_pending_controls
from turnkit._engine.deliveries import callback_verdict, completion_delivery
from turnkit._engine.dispatch import model_policy
from turnkit._engine.executions import with_arguments
from turnkit._engine.lane_order import earlier_turns
from turnkit._engine.prepared import submit_prepared
from turnkit._engine.transcript import TERMINAL_SKIP, append_tool_result, fail_execution, repair_transcript
from turnkit._engine.turn_build import create_turn, queued_with_root, root_of, ticket_of
from turnkit._temporal.heartbeats import heartbeating
from turnkit.agent import resolve_agent
from turnkit.events import announce, announce_message
from turnkit.kernel.activities import TurnCalls, implements
from turnkit.kernel.errors import (
    BudgetError,
    ConfigError,
    ModelError,
    RecordNotFound,
    ToolError,
    TransientModelError,
    error_class_name,
)
from turnkit.kernel.payloads import (
    FinishTurn,
    SettleToolCall,
    SubmitTurn,
    ToolOutcome,
    TurnOutcome,
    TurnTicket,
    output_preview,
)
from turnkit.kernel.records import (
    ACTIVE_TURN_STATUSES,
    OPEN_EXECUTION_STATUSES,
    TERMINAL_TURN_STATUSES,
    WORKING_TURN_STATUSES,
    ToolExecutionRecord,
    TurnRecord,
)
from turnkit.model import Result
from turnkit.store.store import Store, StoreTx, utcnow

__all__ = ["TurnActivities", "unstaged"]


class TurnActivities(TurnCalls):
    """Activities that write turn records, bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @implements(TurnCalls.submit_turn)
    async def submit_turn(self, request: SubmitTurn) -> TurnTicket:
        """Append the trigger message and create the submitted, pending turn (behaviour §1.4); idempotent by turn id.

        The ticket names the submitted turns this lane may not have queued (``earlier``: lost submissions, see
        :mod:`turnkit._engine.lane_order`), so they run first.
        """
        graph = bool(request.wait_for)  # the wait-graph lock comes before any row lock
        task_queue = activity.info().task_queue if activity.in_activity() else None  # the lane's, when a lane calls
        async with self.store.atomic(conversation_id=request.conversation_id, wait_graph=graph) as tx:
            existing = await tx.find_turn(request.turn_id)
            if existing is not None:
                if existing.submitted_at is None and existing.parent_turn_id is None:
                    existing = await submit_prepared(tx, existing)  # a prepared turn's submission (build_turn)
                return await _ticket(tx, existing, request.known_turn_id)
            try:
                conversation = await tx.load_conversation(request.conversation_id)
                agent = resolve_agent(request.agent_name or conversation.agent_name)
                staged_id = request.staged_input_id
                if staged_id is not None:  # the content travelled by id (issue 8 item 12)
                    request = unstaged(request, await tx.load_staged_input(staged_id))
                    await tx.delete_staged_input(staged_id)  # gone when the message and the turn commit
                if request.root_turn_id is not None:
                    joined = await tx.load_turn(request.root_turn_id)
                    if joined.root_turn_id != joined.id:
                        raise ApplicationError(
                            f"root_turn_id {joined.id} is not a root turn (its root is {joined.root_turn_id})",
                            type="InputError",
                            non_retryable=True,
                        )
            except (RecordNotFound, ConfigError) as err:
                raise ApplicationError(str(err), type=type(err).__name__, non_retryable=True) from err
            try:
                # found_absent: the find_turn above, in this transaction, found no turn with this id.
                turn = await create_turn(
                    tx, conversation, agent, request, submitted=True, found_absent=True, task_queue=task_queue
                )
            except ToolError as err:  # a refused wait: rolls back the turn and its trigger message too
                raise ApplicationError(str(err), type="ToolError", non_retryable=True) from err
            return await _ticket(tx, turn, request.known_turn_id)

    @implements(TurnCalls.finish_turn)
    async def finish_turn(self, finish: FinishTurn) -> TurnOutcome:
        """Write a turn's terminal status (failed, or completed by a terminal tool); a no-op on a finished turn, and on
        a paused one with ``unless_paused`` (the root deadline does not end a paused turn, behaviour §5.13.11)."""
        # A finish that may call judges runs with a heartbeat timeout, so that a killed worker's attempt is retried
        # within it instead of at the end of a model call's timeout: it beats for its whole body, store phases included.
        async with heartbeating():
            return await self._finish_turn(finish)

    async def _finish_turn(self, finish: FinishTurn) -> TurnOutcome:
        skipped = await with_arguments(self.store, finish.turn_id, finish.skipped_calls)  # large ones: from the store
        finish = finish.model_copy(update={"skipped_calls": skipped})
        turn = await self.store.load_turn(finish.turn_id)
        if finish.unless_paused and turn.status == "paused":
            return _still_paused(turn)
        audit: AnswerAudit | None = None
        if finish.terminal_execution_id is not None and _unaudited(turn, finish.terminal_execution_id):
            # The terminal tool's answer is audited like any final answer (behaviour §3.2 phase output, §3.9).
            if finish.judge_apart:
                audit, failed, more = await self._judge_terminal(turn, finish.terminal_execution_id)
                if more:
                    return TurnOutcome(turn_id=turn.id, status="completed", judged=True)
            else:
                audit, failed = await self._audit_terminal(turn, finish.terminal_execution_id)
            if failed is not None:
                finish = failed
        verdict = await callback_verdict(turn)  # asked before the terminal write's transaction (behaviour §7.4)
        already_done = False
        finished: TurnRecord | None = None
        async with self.store.atomic(turn_id=turn.root_turn_id) as tx:
            turn = await tx.load_turn(finish.turn_id)
            if finish.unless_paused and turn.status == "paused":
                return _still_paused(turn)  # paused meanwhile: nothing written
            if turn.terminal:  # a retry after commit: make sure what follows the terminal write happened
                await completion_delivery(tx, turn, verdict)
                already_done = True
            elif finish.status == "completed":
                ended = await self._complete_by_terminal_tool(tx, turn, finish, audit)
                if isinstance(ended, TurnOutcome):
                    return ended  # not published: a revision request or a control (now or by an earlier attempt)
                finished = ended
            else:
                await repair_transcript(tx, turn)
                finished = await tx.claim_turn(
                    turn.id,
                    # A waiting turn fails too: its deadline counts the time spent waiting (a paused one only
                    # for a workflow recorded before the patch pause-outlasts-deadline, which sends unless_paused).
                    from_=ACTIVE_TURN_STATUSES,
                    to=finish.status,
                    error={"class": finish.error_class or "TurnKit::Error", "message": finish.error_message or ""},
                    completed_at=utcnow(),
                    claim_token=None,
                )
            if not already_done:
                turn = finished or await tx.load_turn(turn.id)
                await completion_delivery(tx, turn, verdict)  # committed with the terminal write (behaviour §5.7)
            if audit is not None and finished is not None:  # its events before the turn's own (behaviour §3.2)
                over_budget = (finished.error or {}).get("class") == BudgetError.qualified_name
                announce_audit_in(tx, finished, audit, published=not over_budget)
            # Only the write that ended the turn reports it: not a retry, nor a turn cancelled meanwhile.
            if finished is not None and finished.status == "completed":
                announce(
                    tx,
                    "turn.completed",
                    turn.id,
                    turn.conversation_id,
                    status="completed",
                    output_text=turn.output_text,
                )
            elif finished is not None:
                announce(tx, "turn.failed", turn.id, turn.conversation_id, error=turn.error)
        await announce_terminal(self.store, turn)
        return outcome_of(turn)

    async def _audit_terminal(
        self, turn: TurnRecord, execution_id: str
    ) -> tuple[AnswerAudit | None, FinishTurn | None]:
        """The audit of a terminal tool's answer, made before the finish transaction (a judge is a model call); or,
        when a judge call or a constraint failed, the failed finish to write instead (as the model activity fails a
        turn whose audit failed; a transient provider failure is retried up to the model's attempts first)."""
        agent = resolve_agent(turn.agent_name)
        async with self.store.atomic() as tx:
            execution = await tx.load_tool_execution(execution_id)
        try:
            return await audit_terminal_answer(
                self.store, turn, agent, _completion_text(turn, execution), execution_id
            ), None
        except TransientModelError as err:
            if activity.info().attempt < model_policy().max_attempts:
                raise ApplicationError(str(err), type="TransientModelError") from err
            error_class, message = "TurnKit::ModelError", str(err)
        except (ModelError, ConfigError) as err:
            error_class, message = error_class_name(err), str(err)
        failed = FinishTurn(turn_id=turn.id, status="failed", error_class=error_class, error_message=message)
        return None, failed

    async def _judge_terminal(
        self, turn: TurnRecord, execution_id: str
    ) -> tuple[AnswerAudit | None, FinishTurn | None, bool]:
        """A terminal tool's answer judged one call per attempt (``FinishTurn.judge_apart``): the next judge's call,
        committed with its charge (True: more remain, the workflow calls again); once all have answered, the audit
        read from their committed answers. Or the failed finish to write instead: a judge that failed, as
        :meth:`_audit_terminal` maps it, or the tree over ``max_spend`` before or after a judge's call."""
        agent = resolve_agent(turn.agent_name)
        if not agent.output_policy:
            return None, None, False  # nothing to audit
        key = f"terminal:{execution_id}"
        async with self.store.atomic() as tx:
            execution = await tx.load_tool_execution(execution_id)
        answer = Result.build(text=_completion_text(turn, execution), output_data=turn.state.output_data)
        try:
            judged = await judge_next(self.store, turn, agent, key, answer)
            if judged.stopped:
                return None, None, False  # ended meanwhile: the finish's transaction sees it
            if judged.denial is not None:
                return None, _failed(turn, BudgetError.qualified_name, judged.denial), False
            if judged.remaining:
                return None, None, True
            current = await self.store.load_turn(turn.id)
            messages = await self.store.list_messages(turn.conversation_id, turn_id=turn.id)
            return await answered_audit(current, agent, answer, key, messages), None, False
        except TransientModelError as err:
            if activity.info().attempt < model_policy().max_attempts:
                raise ApplicationError(str(err), type="TransientModelError") from err
            error_class, message = "TurnKit::ModelError", str(err)
        except (ModelError, ConfigError) as err:
            error_class, message = error_class_name(err), str(err)
        return None, _failed(turn, error_class, message), False

    async def _complete_by_terminal_tool(
        self, tx: StoreTx, turn: TurnRecord, finish: FinishTurn, audit: AnswerAudit | None
    ) -> TurnRecord | TurnOutcome | None:
        """Behaviour §3.8: skip the calls after a terminal tool, append its completion message, complete the turn
        (its record returned; None if it was no longer running). Not published (a :class:`TurnOutcome` saying why):
        a dirty ``audit`` (§3.9) with a revision left asks for one, the turn left running in phase ``model``; a
        pending pause or steering passes the control boundary first (§5.10, as ``complete_with_output`` does)."""
        assert finish.terminal_execution_id is not None
        if turn.state.audited_execution_id == finish.terminal_execution_id:
            return _unpublished(turn)  # an earlier attempt held this answer back (a revision request or a control)
        execution = await tx.load_tool_execution(finish.terminal_execution_id)
        for call in finish.skipped_calls:
            skipped, created = await tx.create_tool_execution(
                turn_id=turn.id,
                tool_call_id=call.id,
                tool_name=call.name,
                arguments=call.arguments,
                status="cancelled",
                result={"skipped": True, "message": TERMINAL_SKIP.format(name=execution.tool_name)},
                completed_at=utcnow(),
            )
            if created:
                announce(tx, "tool_call.skipped", turn.id, turn.conversation_id, id=call.id, name=call.name)
            if created or skipped.status != "pending":
                await append_tool_result(tx, turn, skipped)
        text = _completion_text(turn, execution)
        announce_message(
            tx, await tx.append_message(turn.conversation_id, role="assistant", text=text, turn_id=turn.id)
        )
        state = turn.state.model_copy(update={"phase": "output", "terminal_tool_name": execution.tool_name})
        status, error = "completed", None
        if audit is not None:
            agent = resolve_agent(turn.agent_name)
            state = state.model_copy(update={"candidate": text, "audited_execution_id": execution.id})
            turn = await charge_judges(tx, turn, audit)
            denial = await tree_spend_denial(tx, turn)
            if denial is not None:
                # Over max_spend right after the judges' charge (behaviour §6.2), as on the model path: the turn
                # fails with the budget error; the completion message stays in the transcript, nothing is published.
                return await tx.claim_turn(
                    turn.id,
                    from_=WORKING_TURN_STATUSES,
                    to="failed",
                    error={"class": BudgetError.qualified_name, "message": denial},
                    options=turn.options.with_state(state),
                    completed_at=utcnow(),
                    claim_token=None,
                )
            turn = await record_audit(tx, turn, agent, audit, state=state)
            if audit.attempt is not None:
                announce_audit_in(tx, turn, audit, published=False)
                return TurnOutcome(turn_id=turn.id, status="completed", revised=True)
            state = turn.state
            status, error = publication(agent, turn)  # failed: a dirty audit in fail mode (the answer is kept)
        if has_pending_controls(turn):
            # Controls that arrived while the tool ran apply before publication: the answer is held (phase output,
            # its candidate), published once resumed (by the model activity's boundary) or dropped by steering.
            held = state.model_copy(update={"candidate": text, "audited_execution_id": execution.id})
            turn = await tx.update_turn(turn.id, options=turn.options.with_state(held))
            boundary, turn = await control_boundary(tx, turn)
            if audit is not None:
                announce_audit_in(tx, turn, audit, published=False)
            if boundary is not None:
                return TurnOutcome(turn_id=turn.id, status="completed", boundary=boundary)
        return await tx.claim_turn(
            turn.id,
            from_=WORKING_TURN_STATUSES,
            to=status,
            output_text=text,
            options=turn.options.with_state(state),
            completed_at=utcnow(),
            claim_token=None,
            **({"error": error} if error else {}),
        )

    @implements(TurnCalls.settle_tool)
    async def settle_tool(self, settle: SettleToolCall) -> ToolOutcome:
        """Record a tool call whose activity was lost (``interrupted``) or finally failed; first writer wins."""
        [call] = await with_arguments(self.store, settle.turn_id, [settle.call])
        settle = settle.model_copy(update={"call": call})
        turn = await self.store.load_turn(settle.turn_id)
        async with self.store.atomic(turn_id=turn.root_turn_id) as tx:
            execution = await tx.find_tool_execution(turn.id, settle.call.id)
            if execution is None:
                execution, _ = await tx.create_tool_execution(
                    turn_id=turn.id,
                    tool_call_id=settle.call.id,
                    tool_name=settle.call.name,
                    arguments=settle.call.arguments,
                    status="running",
                    started_at=utcnow(),
                )
            if execution.status in OPEN_EXECUTION_STATUSES:  # under the root lock: this CAS wins
                execution = await fail_execution(tx, turn, execution, settle.message, status=settle.outcome)
                if execution.status == "interrupted":  # a failed one announced tool_call.failed
                    announce(
                        tx,
                        "tool_call.interrupted",
                        turn.id,
                        turn.conversation_id,
                        id=settle.call.id,
                        name=settle.call.name,
                        tool_execution_id=execution.id,
                    )
            else:
                await append_tool_result(tx, turn, execution)
        # A call whose activity committed but whose completion was lost is settled here as it was recorded: a
        # terminal tool still ends the turn, a budget denial still fails it (issue 8).
        return outcome_of_execution(execution, find_tool(turn.agent_name, settle.call.name, settle.call.policy))


def _failed(turn: TurnRecord, error_class: str, message: str) -> FinishTurn:
    """The finish that fails ``turn`` with an error instead of publishing its answer."""
    return FinishTurn(turn_id=turn.id, status="failed", error_class=error_class, error_message=message)


def _unpublished(turn: TurnRecord) -> TurnOutcome:
    """What an earlier attempt that held a terminal answer back reported: paused, or back to the model."""
    if turn.status == "paused":
        return TurnOutcome(turn_id=turn.id, status="completed", boundary="paused")
    return TurnOutcome(turn_id=turn.id, status="completed", revised=True)


def _unaudited(turn: TurnRecord, execution_id: str) -> bool:
    """The terminal answer of ``execution_id`` still needs its audit (no earlier attempt committed it)."""
    return not turn.terminal and turn.state.audited_execution_id != execution_id


def _completion_text(turn: TurnRecord, execution: ToolExecutionRecord) -> str:
    """A terminal tool's completion message: the turn's answer (behaviour §3.8)."""
    tool = resolve_agent(turn.agent_name).tool(execution.tool_name, turn.state.loaded_skills)
    return tool.completion_message(execution.result or {}) if tool else f"Completed via {execution.tool_name}."


async def _ticket(tx: StoreTx, turn: TurnRecord, known_turn_id: str | None) -> TurnTicket:
    """The submitted ``turn``'s ticket, with what its lane must know of the turns it does not run (``busy``, ``ahead``:
    docs/design.md, "A fresh conversation's first turn") and of the submitted turns it may have lost (``earlier``)."""
    outside = await tx.turns_outside_lane(turn.conversation_id)
    ahead = outside.direct if outside.direct is not None and outside.direct.id != turn.id else None
    ticket = ticket_of(
        turn,
        busy=outside.sub_agent,
        root=await root_of(tx, turn),
        ahead=None if ahead is None else await queued_with_root(tx, ahead),
    )
    if turn.parent_turn_id is None:
        ticket.earlier = await earlier_turns(tx, turn.conversation_id, known_turn_id, before=turn)
    return ticket


def _still_paused(turn: TurnRecord) -> TurnOutcome:
    """A paused turn past its deadline is left paused (behaviour §5.13 invariant 11): its workflow awaits a resume."""
    return TurnOutcome(turn_id=turn.id, status="failed", paused=True)


def outcome_of(turn: TurnRecord) -> TurnOutcome:
    """The workflow result for a finished turn record."""
    error = turn.error or {}
    status = turn.status if turn.status in TERMINAL_TURN_STATUSES else "failed"
    return TurnOutcome(
        turn_id=turn.id,
        status=status,  # type: ignore[arg-type]
        error_class=error.get("class"),
        error_message=error.get("message"),
        output_preview=output_preview(turn.output_text) if status == "completed" else None,
    )


def unstaged(request: SubmitTurn, content: dict[str, Any]) -> SubmitTurn:
    """``request`` with the content staged for it (``StoreTx.stage_input``) put back in its inline fields."""
    return request.model_copy(
        update={
            "text": content.get("text", ""),
            "context": content.get("context"),
            "principal": content.get("principal"),
            "message_metadata": content.get("metadata") or {},
        }
    )
