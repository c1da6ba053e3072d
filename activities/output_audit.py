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

An answer given by a terminal tool (behaviour §3.2 phase ``tools``, then ``output``) is audited the same way inside
``turnkit.finish_turn``: :func:`audit_terminal_answer` before its transaction, then :func:`record_audit`, the judges'
charges (:func:`charge_judges`) and :func:`audit_events` in it, keyed by the execution id
(``state.audited_execution_id``) so that a retried finish neither audits again nor asks for a second revision.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from turnkit._engine.authorization import Verdict
from turnkit._engine.charges import charge_turn
from turnkit._engine.controls import control_boundary, has_pending_controls
from turnkit._engine.deliveries import completion_delivery
from turnkit._temporal.heartbeats import heartbeating
from turnkit.agent import Agent
from turnkit.config import settings
from turnkit.cost import Cost, cost_from_usage
from turnkit.events import announce, announce_message, emit
from turnkit.kernel.errors import OutputAudit
from turnkit.kernel.payloads import ModelStep, output_preview
from turnkit.kernel.records import MessageRecord, TurnRecord
from turnkit.kernel.turn_state import TurnState
from turnkit.model import ModelRequest, Result, Usage
from turnkit.output_policy import AuditResult, OutputPolicy, audit_output, revision_request
from turnkit.store.store import Store, StoreTx, utcnow

__all__ = [
    "AnswerAudit",
    "JudgeCharge",
    "PublishedStatus",
    "announce_audit",
    "announce_audit_in",
    "announce_step_end",
    "audit_answer",
    "audit_events",
    "audit_terminal_answer",
    "call_judge",
    "charge_judges",
    "judge_model",
    "judge_thinking",
    "publication",
    "publish_answer",
    "record_audit",
    "run_audit",
]


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
    charges: list[JudgeCharge] = field(default_factory=list)
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
        answer, model, cost = await call_judge(store, turn, agent, policy, request)
        charges.append(JudgeCharge(model, answer.usage, cost))
        return answer

    return AnswerAudit(await run_audit(turn, agent, result, messages, ask), charges)


def judge_model(turn: TurnRecord, agent: Agent, policy: OutputPolicy) -> str:
    """A judge's model: its own, else the agent's ``output_policy_model``, the setting, the turn's model."""
    return (
        policy.model
        or agent.output_policy_model
        or settings.output_policy_model
        or turn.model
        or settings.default_model
    )


def judge_thinking(agent: Agent, policy: OutputPolicy) -> dict[str, Any] | None:
    """A judge's thinking: its own, else the agent's ``output_policy_thinking``, else the setting."""
    for each in (policy.thinking, agent.output_policy_thinking):
        if each is not None:
            return each
    return settings.output_policy_thinking


async def audit_terminal_answer(
    store: Store, turn: TurnRecord, agent: Agent, text: str, execution_id: str
) -> AnswerAudit | None:
    """Audit the answer of a turn ended by a terminal tool: its completion message ``text`` (or the turn's
    ``state.output_data`` when set, behaviour §3.2 phase ``output``). None when the agent has no output policy.

    Raises: as :func:`audit_answer`.
    """
    if not agent.output_policy:
        return None
    messages = await store.list_messages(turn.conversation_id, turn_id=turn.id)
    answer = Result.build(text=text, output_data=turn.state.output_data)
    # The judges' request metadata names the execution: the answer has no model request of its own.
    return await audit_answer(turn, agent, answer, f"terminal:{execution_id}", messages, store=store)


async def charge_judges(tx: StoreTx, turn: TurnRecord, audit: AnswerAudit) -> TurnRecord:
    """Charge the audit's judge calls to the turn (they are model calls of the turn, behaviour §3.9)."""
    for judge in audit.charges:
        turn = await charge_turn(tx, turn, judge.usage, judge.cost)
    return turn


async def record_audit(
    tx: StoreTx, turn: TurnRecord, agent: Agent, audit: AnswerAudit, *, state: TurnState | None = None
) -> TurnRecord:
    """Write the audit into the turn's state; after a dirty one with revisions left, ask for a revision.

    The revision request is a user text message (metadata ``{source: "output_policy", attempt}``) and the phase goes
    back to ``model``, so the workflow asks the model again. Runs in the transaction that persists the answer;
    ``state`` is the turn's state as that transaction left it (default: the stored one).
    """
    state = (state or turn.state).model_copy(update={"policy_audit": audit.result.to_dict()})
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
        # A terminal tool's answer is dropped with the others: the next answer says for itself how it ended.
        state = state.model_copy(
            update={
                "phase": "model",
                "revisions_used": attempt,
                "candidate": None,
                "output_data": None,
                "terminal_tool_name": None,
            }
        )
        audit.attempt = attempt
    return await tx.update_turn(turn.id, options=turn.options.with_state(state))


#: How an answer ends its turn once published: completed, or failed by a dirty audit in ``fail`` mode.
PublishedStatus = Literal["completed", "failed"]


def publication(agent: Agent, turn: TurnRecord) -> tuple[PublishedStatus, dict[str, Any] | None]:
    """How the turn's answer ends it: ``("completed", None)``, or ``("failed", error)`` when its audit is dirty and
    the agent's mode is ``fail`` (the error record ``{class: "TurnKit::OutputAudit", message, policy_audit}``)."""
    audit = turn.state.policy_audit
    if audit is None or audit.get("clean") or agent.output_policy_mode != "fail":
        return "completed", None
    message = "; ".join(AuditResult.from_dict(audit).messages)
    return "failed", {"class": OutputAudit.qualified_name, "message": message, "policy_audit": audit}


async def publish_answer(
    tx: StoreTx,
    turn: TurnRecord,
    agent: Agent,
    *,
    text: str,
    output_data: Any,
    message_id: str | None,
    verdict: Verdict,
    audit: AnswerAudit | None,
    ended: list[TurnRecord],
) -> ModelStep:
    """Publish a final answer, under the root's lock (behaviour §3.2 phase ``output``): record its ``audit`` (a dirty
    one with a revision left asks for the revision instead: step ``tools``), pass the control boundary (a pending
    control holds the answer as the candidate: ``paused``, or ``steered``), then end the turn ``completed``, or
    ``failed`` with ``TurnKit::OutputAudit``, with its completion delivery; the terminal record is put in ``ended``."""
    if audit is not None:
        turn = await record_audit(tx, turn, agent, audit)
        if audit.attempt is not None:  # a revision request: no calls, so the workflow asks the model again
            return ModelStep(outcome="tools", message_id=message_id)
    if has_pending_controls(turn):
        # Controls arrived while the model answered: they apply before publication (behaviour §5.10).
        state = turn.state.model_copy(update={"phase": "output", "candidate": text, "output_data": output_data})
        turn = await tx.update_turn(turn.id, options=turn.options.with_state(state))
        boundary, _ = await control_boundary(tx, turn)
        return ModelStep(outcome=boundary or "tools", message_id=message_id)
    status, error = publication(agent, turn)  # failed: a dirty audit in fail mode (the answer is kept)
    completed = await tx.claim_turn(
        turn.id,
        from_="running",
        to=status,
        output_text=text,
        output_data=output_data,
        completed_at=utcnow(),
        claim_token=None,
        **({"error": error} if error else {}),
    )
    if completed is not None:
        await completion_delivery(tx, completed, verdict)  # with the terminal write (behaviour §5.7)
        ended.append(completed)
    if error is not None:
        return ModelStep(
            outcome="failed", message_id=message_id, error_class=error["class"], error_message=error["message"]
        )
    return ModelStep(outcome="completed", message_id=message_id, output_preview=output_preview(text))


async def run_audit(
    turn: TurnRecord,
    agent: Agent,
    answer: Result,
    messages: Sequence[MessageRecord],
    ask: Callable[[ModelRequest, OutputPolicy], Awaitable[Result]],
) -> AuditResult:
    """The agent's output policy applied to ``answer`` (behaviour §3.9), each judge asked through ``ask`` (a paid call
    now, or an answer committed earlier); the constraints read the turn's own ``messages``."""
    return await audit_output(
        agent.output_policy,
        output_text=answer.text,
        output_data=answer.output_data,
        turn=turn,
        # Copies: the model activity's records are its worker's kept transcript (turnkit._engine.transcripts).
        messages=[m.model_copy(deep=True) for m in messages if m.turn_id == turn.id],
        ask=ask,
        judge_model=lambda p: judge_model(turn, agent, p),
        judge_thinking=lambda p: judge_thinking(agent, p),
    )


async def call_judge(
    store: Store | None, turn: TurnRecord, agent: Agent, policy: OutputPolicy, request: ModelRequest
) -> tuple[Result, str, Cost]:
    """One judge's paid call for ``turn``: ``output_policy.model.requested`` sent, then the policy's client (else the
    agent's) asked, heartbeating; its answer, the model that answered and what it cost."""
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
    return answer, model, cost_from_usage(answer.usage, model)


def audit_events(audit: AnswerAudit, *, published: bool) -> list[tuple[str, dict[str, Any]]]:
    """The audit's events in order: each judge call, then the revision or (``published``) the verdict."""
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "output_policy.model.completed",
            {"model": c.model, "tool_call_count": 0, "usage": c.usage.to_record(), "cost": c.cost.total},
        )
        for c in audit.charges
    ]
    count = len(audit.result.violations)
    if audit.attempt is not None:
        events.append(("output_policy.revision", {"violation_count": count, "attempt": audit.attempt}))
    elif published:
        events.append(("output_policy.completed", {"clean": audit.result.clean, "violation_count": count}))
    return events


async def announce_audit(turn: TurnRecord, audit: AnswerAudit, *, published: bool, store: Store | None = None) -> None:
    """The audit's events (:func:`audit_events`), sent now: after the commit that recorded it."""
    for kind, payload in audit_events(audit, published=published):
        await emit(kind, turn.id, turn.conversation_id, store=store, **payload)


async def announce_step_end(
    turn: TurnRecord, audit: AnswerAudit | None, step: ModelStep, output_text: str, *, store: Store
) -> None:
    """After the commit that recorded a model step: the audit's events (if any), then the turn's end, if the step
    ended it (``turn.completed`` with ``output_text``, or ``turn.failed``)."""
    if audit is not None:
        await announce_audit(turn, audit, published=step.outcome in ("completed", "failed"), store=store)
    if step.outcome == "completed":
        await emit(
            "turn.completed", turn.id, turn.conversation_id, store=store, status="completed", output_text=output_text
        )
    elif step.outcome == "failed":
        error = {"class": step.error_class, "message": step.error_message}
        await emit("turn.failed", turn.id, turn.conversation_id, store=store, error=error)


def announce_audit_in(tx: StoreTx, turn: TurnRecord, audit: AnswerAudit, *, published: bool) -> None:
    """The audit's events (:func:`audit_events`), sent once ``tx`` commits (before what the caller announces next)."""
    for kind, payload in audit_events(audit, published=published):
        announce(tx, kind, turn.id, turn.conversation_id, **payload)
