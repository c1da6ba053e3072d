"""The ``turnkit.audit`` activity: the output-policy audit of a final answer the model activity already committed.

The model activity commits a final answer and its charge before anything can fail, and says ``audit`` when the
agent has an output policy (behaviour §3.9). The workflow then calls this activity until it says otherwise. Each
attempt makes at most one paid call: the next judge's (:func:`turnkit._activities.judges.judge_next`, its answer and
charge committed together), after a budget check. Once every judge has answered, the same attempt runs the
constraints and publishes the answer (:func:`turnkit._activities.output_audit.publish_answer`): a revision request,
a hold at a pending control, or the turn's end. A retried attempt finds what its predecessor committed, so no
judge is asked twice and nothing is published twice.
"""

from __future__ import annotations

from turnkit._activities.failures import provider_failure
from turnkit._activities.judges import answered_audit, judge_next
from turnkit._activities.notify import announce_terminal
from turnkit._activities.output_audit import AnswerAudit, announce_step_end, publish_answer
from turnkit._activities.store_retry import retry_store
from turnkit._engine.deliveries import callback_verdict
from turnkit.agent import Agent, resolve_agent
from turnkit.kernel.activities import ModelCalls, implements
from turnkit.kernel.errors import ConfigError, ModelError, OutputAudit, TransientModelError
from turnkit.kernel.payloads import AuditCall, ModelStep
from turnkit.kernel.records import TurnRecord
from turnkit.model import Result
from turnkit.store.store import Store

__all__ = ["AuditActivities"]


class AuditActivities(ModelCalls):
    """The audit activity bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @implements(ModelCalls.audit)
    async def audit(self, call: AuditCall) -> ModelStep:
        """One step of the audit of the answer to ``call.request_id`` (see the module docstring)."""
        turn = await retry_store(lambda: self.store.load_turn(call.turn_id), what="audit")
        if not _awaiting(turn, call.request_id):
            return _settled(turn)  # an earlier attempt published it, or the turn ended meanwhile
        message_id = turn.state.message_id
        try:
            agent = resolve_agent(turn.agent_name)
        except ConfigError as err:
            raise provider_failure(err) from err
        answer = Result.build(text=turn.state.candidate or "", output_data=turn.state.output_data)
        try:
            judged = await judge_next(self.store, turn, agent, call.request_id, answer)
        except (ModelError, ConfigError, TransientModelError) as err:
            raise provider_failure(err) from err
        if judged.stopped:
            return _settled(await retry_store(lambda: self.store.load_turn(call.turn_id), what="audit"))
        if judged.denial is not None:
            return ModelStep(outcome="budget_exceeded", message_id=message_id, budget_error=judged.denial)
        if judged.remaining:
            return ModelStep(outcome="audit", message_id=message_id)
        return await self._publish(call, agent, answer)

    async def _publish(self, call: AuditCall, agent: Agent, answer: Result) -> ModelStep:
        """Every judge answered: run the constraints and publish the answer (once: keyed by the request id)."""
        turn = await retry_store(lambda: self.store.load_turn(call.turn_id), what="audit")
        messages = await retry_store(
            lambda: self.store.list_messages(turn.conversation_id, turn_id=turn.id), what="audit messages"
        )
        try:
            audit = await answered_audit(turn, agent, answer, call.request_id, messages)
        except ConfigError as err:
            raise provider_failure(err) from err
        # Asked before the terminal write's transaction (behaviour §7.4), never inside it.
        verdict = await callback_verdict(turn)
        ended: list[TurnRecord] = []

        async def write() -> tuple[ModelStep, bool]:
            ended.clear()
            look = self.store.atomic(turn_id=call.root_turn_id, conversation_id=turn.conversation_id)
            async with look as tx:
                current = await tx.load_turn(call.turn_id)
                if not _awaiting(current, call.request_id):
                    return _settled(current), False
                state = current.state.model_copy(update={"awaiting_audit": False})
                current = current.model_copy(update={"options": current.options.with_state(state)})
                step = await publish_answer(
                    tx,
                    current,
                    agent,
                    text=answer.text,
                    output_data=answer.output_data,
                    message_id=state.message_id,
                    verdict=verdict,
                    audit=audit,
                    ended=ended,
                )
                return step, True

        step, written = await retry_store(write, what="audit publish")
        if written:
            await self._announce_written(turn, audit, step, answer)
        if step.outcome in ("completed", "failed"):
            # The attempt that published may have died before signalling: every attempt that finds the end signals.
            ended_turn = ended[-1] if ended else await retry_store(lambda: self.store.load_turn(turn.id), what="audit")
            await retry_store(lambda: announce_terminal(self.store, ended_turn), what="audit announce")
        return step

    async def _announce_written(self, turn: TurnRecord, audit: AnswerAudit, step: ModelStep, answer: Result) -> None:
        """The audit's verdict and the turn's end, after the commit that recorded them."""
        await announce_step_end(turn, audit, step, answer.text, store=self.store)


def _awaiting(turn: TurnRecord, request_id: str) -> bool:
    """The turn is running and its answer to ``request_id`` waits for its audit."""
    state = turn.state
    return turn.status == "running" and state.awaiting_audit and state.audit_key == request_id


def _settled(turn: TurnRecord) -> ModelStep:
    """What an audit that was already carried through left the turn at (a retried attempt returns it again)."""
    message_id = turn.state.message_id
    error = turn.error or {}
    if turn.status == "completed":
        return ModelStep(outcome="completed", message_id=message_id)
    if turn.status == "failed" and error.get("class") == OutputAudit.qualified_name:
        return ModelStep(
            outcome="failed", message_id=message_id, error_class=error["class"], error_message=error.get("message")
        )
    if turn.status == "paused":
        return ModelStep(outcome="paused", message_id=message_id)
    if turn.status in ("running", "pending", "waiting"):
        return ModelStep(outcome="tools", message_id=message_id)  # a revision or steering: ask the model again
    return ModelStep(outcome="stopped")
