"""An answer's output-policy judges, one call at a time, each committed with its charge (behaviour §3.9, §6.2).

A judge's call is paid like the turn's own: its answer is committed, and charged to the turn, in the transaction
right after the call, before anything else can fail. ``state.judge_answers`` holds the answers given to the answer
named by ``state.audit_key`` (a model request's id, or ``terminal:<execution id>``), so an attempt that finds one
asks the next judge instead of asking that one again, and the audit reads them instead of calling
(:func:`answered_audit`). The tree's ``max_spend`` is checked before each call: a tree over it asks no judge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from turnkit._activities.output_audit import AnswerAudit, call_judge, judge_model, judge_thinking, run_audit
from turnkit._activities.store_retry import retry_store
from turnkit._engine.charges import charge_turn, tree_spend_denial
from turnkit.agent import Agent
from turnkit.events import announce
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.records import MessageRecord, TurnRecord
from turnkit.kernel.turn_state import TurnState
from turnkit.model import ModelRequest, Result
from turnkit.output_policy import OutputPolicy, judged_text
from turnkit.store.store import Store

__all__ = ["JudgeStep", "answered_audit", "answers_for", "judge_next", "judges_of"]


@dataclass(frozen=True)
class JudgeStep:
    """Where an answer's judges stand after :func:`judge_next`."""

    #: Judges still to ask.
    remaining: int
    #: ``"cost limit reached"``: the tree was over ``max_spend`` before a call (none was made), or the charge of the
    #: call just made took it over.
    denial: str | None = None
    #: The turn is no longer running: nothing was asked, or the late answer was dropped.
    stopped: bool = False


def judges_of(agent: Agent) -> list[OutputPolicy]:
    """The agent's LLM judges, in policy order (its other constraints make no paid call)."""
    return [each for each in agent.output_policy if isinstance(each, OutputPolicy)]


def answers_for(state: TurnState, key: str) -> list[dict[str, Any]]:
    """The judges' committed answers to the answer ``key`` (none while the state names another answer)."""
    return list(state.judge_answers) if state.audit_key == key else []


async def judge_next(store: Store, turn: TurnRecord, agent: Agent, key: str, answer: Result) -> JudgeStep:
    """Ask the first judge that has no committed answer to ``answer`` (named ``key``), then commit its answer and
    charge in one transaction under the root's lock. Asks nothing when every judge has answered, when the tree is
    over ``max_spend``, or when the turn is no longer running.

    Raises:
        ModelError, TransientModelError, ConfigError: The judge's call failed (nothing recorded).
    """
    policies = judges_of(agent)

    async def look() -> tuple[TurnRecord, str | None]:
        async with store.reads() as tx:
            current = await tx.load_turn(turn.id)
            return current, (await tree_spend_denial(tx, current) if current.status == "running" else None)

    current, denial = await retry_store(look, what="judge budget")
    if current.status != "running":
        return JudgeStep(0, stopped=True)
    index = len(answers_for(current.state, key))
    if index >= len(policies):
        return JudgeStep(0)
    if denial is not None:
        return JudgeStep(len(policies) - index, denial)  # a paid call refused before it is made (behaviour §6.2)
    policy = policies[index]
    request = _request(current, agent, policy, key, answer)
    result, model, cost = await call_judge(store, current, agent, policy, request)
    given = {
        "policy": policy.name,
        "model": model,
        "text": result.text,
        "output_data": result.output_data,
        "usage": result.usage.to_record(),
        "cost": cost.total,
    }

    async def commit() -> JudgeStep:
        async with store.atomic(turn_id=turn.root_turn_id) as tx:
            now = await tx.load_turn(turn.id)
            if now.status != "running":
                return JudgeStep(0, stopped=True)  # cancelled or ended meanwhile: the late answer is dropped
            answers = answers_for(now.state, key)
            updates: dict[str, Any] = {}
            if len(answers) == index:
                state = now.state.model_copy(update={"audit_key": key, "judge_answers": [*answers, given]})
                updates["options"] = now.options.with_state(state)
            # Else a concurrent attempt recorded this judge first: its answer stands, this paid call is charged too.
            charged = await charge_turn(tx, now, result.usage, cost, **updates)
            announce(
                tx,
                "output_policy.model.completed",
                turn.id,
                turn.conversation_id,
                model=model,
                tool_call_count=0,
                usage=result.usage.to_record(),
                cost=cost.total,
            )
            return JudgeStep(len(policies) - index - 1, await tree_spend_denial(tx, charged))

    # The answer is paid for: keep trying to record it while the store is away (a commit whose acknowledgement was
    # lost is found by the index check, and this call is not charged twice: only a second call is).
    return await retry_store(commit, what="judge persist")


async def answered_audit(
    turn: TurnRecord, agent: Agent, answer: Result, key: str, messages: Sequence[MessageRecord] = ()
) -> AnswerAudit:
    """The audit of ``answer`` (named ``key``) once every judge has answered: the agent's constraints run now, each
    judge's verdict is read from its committed answer (no call, nothing more to charge).

    Raises:
        ConfigError: A constraint failed, or a judge has no committed answer (the agent's policies changed).
    """
    answers = iter(answers_for(turn.state, key))

    async def ask(request: ModelRequest, policy: OutputPolicy) -> Result:
        given = next(answers, None)
        if given is None or given.get("policy") != policy.name:
            raise ConfigError(f"output policy {policy.name} has no committed judge answer")
        return Result.build(text=str(given.get("text") or ""), output_data=given.get("output_data"))

    return AnswerAudit(await run_audit(turn, agent, answer, messages, ask))


def _request(turn: TurnRecord, agent: Agent, policy: OutputPolicy, key: str, answer: Result) -> ModelRequest:
    """The judge's request, with the turn's ids in its metadata (the answer's key as its request id)."""
    request = policy.request(
        judged_text(answer.text, answer.output_data),
        model=judge_model(turn, agent, policy),
        thinking=judge_thinking(agent, policy),
    )
    ids = {"turn_id": turn.id, "conversation_id": turn.conversation_id, "request_id": key}
    return request.model_copy(update={"metadata": {**request.metadata, **ids}})
