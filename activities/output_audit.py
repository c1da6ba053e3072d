"""The output-policy audit of a turn's final answer, inside the ``turnkit.model`` activity (docs/behaviour.md §3.9).

The model activity calls three hooks, so the workflow needs no new command:

1. :func:`audit_answer`, after the model answered and before the persist transaction: runs the agent's constraints;
   an :class:`~turnkit.output_policy.OutputPolicy` judge is a model call made here (an activity, never workflow
   code), with ``output_policy.model.requested`` emitted before it.
2. :func:`record_audit`, in the persist transaction (keyed by the request id like the response itself, so a retried
   attempt finds the committed response and neither audits again nor appends a second revision request): writes
   ``state.policy_audit`` and, when the audit is dirty and revisions remain, appends the revision request (a user
   message) and sets the phase back to ``model``. The judges' usage and cost are charged by the caller in the same
   transaction, so they count against the tree's ``max_spend``. :func:`publication` then says how the answer ends
   the turn: ``completed``, or ``failed`` with ``TurnKit::OutputAudit`` in ``fail`` mode.
3. :func:`announce_audit`, after the commit: ``output_policy.model.completed`` per judge call, then
   ``output_policy.revision`` or ``output_policy.completed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from activities.heartbeat import heartbeating
from turnkit.agent import Agent
from turnkit.config import settings
from turnkit.cost import Cost, cost_from_usage
from turnkit.errors import OutputAudit
from turnkit.events import announce_message, emit
from turnkit.model import ModelRequest, Result, Usage
from turnkit.output_policy import AuditResult, OutputPolicy, audit_output, revision_request
from turnkit.records import MessageRecord, TurnRecord
from turnkit.store.store import Store, StoreTx

__all__ = ["AnswerAudit", "JudgeCharge", "announce_audit", "audit_answer", "publication", "record_audit"]


@dataclass(frozen=True)
class JudgeCharge:
    """One judge call's model, usage and cost (charged to the turn with its answer)."""

    model: str
    usage: Usage
    cost: Cost


@dataclass
class AnswerAudit:
    """The audit of one final answer, with what its judge calls cost."""

    result: AuditResult
    charges: list[JudgeCharge] = field(default_factory=list[JudgeCharge])
    #: Set by :func:`record_audit` when it appended a revision request (its attempt number).
    attempt: int | None = None


async def audit_answer(
    turn: TurnRecord,
    agent: Agent,
    result: Result,
    request_id: str,
    messages: Sequence[MessageRecord] = (),
    *,
    store: Store | None = None,
) -> AnswerAudit | None:
    """Audit a final answer with the agent's output policy (None when the agent has none); ``messages`` are the
    turn's context, for constraints that declare ``messages`` (``require_image``).

    Raises:
        ModelError, TransientModelError, ConfigError: A judge call failed (mapped like the main call's failures),
            or a constraint failed (``ConfigError``: the turn fails, no retry).
    """
    if not agent.output_policy:
        return None
    charges: list[JudgeCharge] = []

    async def ask(request: ModelRequest, policy: OutputPolicy) -> Result:
        ids = {"turn_id": turn.id, "conversation_id": turn.conversation_id, "request_id": request_id}
        request = request.model_copy(update={"metadata": {**request.metadata, **ids}})
        await emit(
            "output_policy.model.requested",
            turn.id,
            turn.conversation_id,
            store=store,
            model=request.model,
            tool_names=[],
            message_count=len(request.messages),
            prompt={"chars": len(request.instructions) + sum(len(str(m["content"])) for m in request.messages)},
        )
        client = policy.client if policy.client is not None else agent.effective_client
        async with heartbeating():
            answer = await client.chat(request)
        model = answer.model or request.model
        charges.append(JudgeCharge(model, answer.usage, cost_from_usage(answer.usage, model)))
        return answer

    def judge_thinking(policy: OutputPolicy) -> dict[str, Any] | None:
        for each in (policy.thinking, agent.output_policy_thinking):
            if each is not None:
                return each
        return settings.output_policy_thinking

    audit = await audit_output(
        agent.output_policy,
        output_text=result.text,
        output_data=result.output_data,
        turn=turn,
        messages=[m for m in messages if m.turn_id == turn.id],
        ask=ask,
        judge_model=lambda p: (
            p.model or agent.output_policy_model or settings.output_policy_model or turn.model or settings.default_model
        ),
        judge_thinking=judge_thinking,
    )
    return AnswerAudit(audit, charges)


async def record_audit(tx: StoreTx, turn: TurnRecord, agent: Agent, audit: AnswerAudit) -> TurnRecord:
    """Write the audit into the turn's state; after a dirty one with revisions left, ask for a revision.

    The revision request is a user text message (metadata ``{source: "output_policy", attempt}``) and the phase goes
    back to ``model``, so the workflow asks the model again. Runs in the transaction that persists the answer.
    """
    state = turn.state.model_copy(update={"policy_audit": audit.result.to_dict()})
    audit.attempt = None
    if not audit.result.clean and state.revisions_used < agent.output_retries:
        attempt = state.revisions_used + 1
        text = revision_request(audit.result, agent.output_policy, terminal_tool=state.terminal_tool_name)
        revision = await tx.append_message(
            turn.conversation_id,
            role="user",
            text=text,
            turn_id=turn.id,
            metadata={"source": "output_policy", "attempt": attempt},
        )
        announce_message(tx, revision)  # message.created once this transaction committed
        state = state.model_copy(
            update={"phase": "model", "revisions_used": attempt, "candidate": None, "output_data": None}
        )
        audit.attempt = attempt
    return await tx.update_turn(turn.id, options=turn.options.with_state(state))


def publication(agent: Agent, turn: TurnRecord) -> tuple[str, dict[str, Any] | None]:
    """How the turn's answer ends it: ``("completed", None)``, or ``("failed", error)`` when its audit is dirty and
    the agent's mode is ``fail`` (the error record ``{class: "TurnKit::OutputAudit", message, policy_audit}``)."""
    audit = turn.state.policy_audit
    if audit is None or audit.get("clean") or agent.output_policy_mode != "fail":
        return "completed", None
    message = "; ".join(AuditResult.from_dict(audit).messages)
    return "failed", {"class": OutputAudit.qualified_name, "message": message, "policy_audit": audit}


async def announce_audit(turn: TurnRecord, audit: AnswerAudit, *, published: bool, store: Store | None = None) -> None:
    """The audit's events, after its commit: each judge call, then the revision or (``published``) the verdict."""
    for charge in audit.charges:
        await emit(
            "output_policy.model.completed",
            turn.id,
            turn.conversation_id,
            store=store,
            model=charge.model,
            tool_call_count=0,
            usage=charge.usage.to_record(),
            cost=charge.cost.total,
        )
    count = len(audit.result.violations)
    if audit.attempt is not None:
        await emit(
            "output_policy.revision",
            turn.id,
            turn.conversation_id,
            store=store,
            violation_count=count,
            attempt=audit.attempt,
        )
    elif published:
        await emit(
            "output_policy.completed",
            turn.id,
            turn.conversation_id,
            store=store,
            clean=audit.result.clean,
            violation_count=count,
        )
