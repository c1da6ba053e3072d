"""``TurnWorkflow``: one TurnKit turn, the model → tools → model loop (spec §3.2).

Temporal owns where the turn is; the store owns what it said. Each iteration is one ``turnkit.model`` activity
(reserve the iteration, call the model, persist the response) followed by one activity per tool call, named
``tool:<name>``, with the retry policy of the tool's recovery mode. Payloads carry ids, never the transcript.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from turnkit.agent import resolve_agent
    from turnkit.config import settings
    from turnkit.payloads import (
        FinishTurn,
        ModelCall,
        ModelStep,
        SettleToolCall,
        ToolCallInput,
        ToolCallRef,
        ToolOutcome,
        TurnInput,
        TurnOutcome,
    )
    from turnkit.records import INTERRUPTED_MESSAGE

__all__ = ["TurnWorkflow"]

# Store writes: quick, idempotent, safe to retry for as long as the database is away.
STORE_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10))
STORE_TIMEOUT = timedelta(seconds=30)
TIMED_OUT = "turn timed out"


@workflow.defn(name="TurnWorkflow")
class TurnWorkflow:
    """Runs one turn to a terminal status and returns a small :class:`TurnOutcome`."""

    def __init__(self) -> None:
        self._outcome: TurnOutcome | None = None

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnOutcome:
        loop = asyncio.create_task(self._loop(turn))
        if turn.deadline is None:
            return await loop
        remaining = (turn.deadline - workflow.now()).total_seconds()
        try:
            # The root deadline covers the whole loop, including a model or tool call in flight (spec §5.12).
            await workflow.wait_condition(loop.done, timeout=max(remaining, 0.001), timeout_summary="turn deadline")
        except TimeoutError:  # wait_condition timed out (asyncio.TimeoutError is TimeoutError)
            loop.cancel()
            try:
                return await loop
            except asyncio.CancelledError:
                return await self._finish(turn, "failed", "TurnKit::BudgetError", TIMED_OUT)
        return loop.result()

    async def _loop(self, turn: TurnInput) -> TurnOutcome:
        iteration = 0
        while True:
            iteration += 1
            step = await self._model(turn, iteration)
            if isinstance(step, TurnOutcome):
                return step
            if step.stopped:
                return TurnOutcome(turn_id=turn.turn_id, status="cancelled")
            if step.budget_error:
                return await self._finish(turn, "failed", "TurnKit::BudgetError", step.budget_error)
            if step.completed:
                return TurnOutcome(turn_id=turn.turn_id, status="completed")
            # Tools run one at a time, in proposal order (spec §3.8).
            for index, call in enumerate(step.tool_calls):
                outcome = await self._tool(turn, call)
                if outcome.budget_error:
                    return await self._finish(turn, "failed", "TurnKit::BudgetError", outcome.budget_error)
                if outcome.terminal:
                    finish = FinishTurn(
                        turn_id=turn.turn_id,
                        status="completed",
                        terminal_execution_id=outcome.execution_id,
                        skipped_calls=step.tool_calls[index + 1 :],
                    )
                    return await self._finish_with(finish)

    async def _model(self, turn: TurnInput, iteration: int) -> ModelStep | TurnOutcome:
        call = ModelCall(
            turn_id=turn.turn_id,
            root_turn_id=turn.root_turn_id,
            request_id=str(workflow.uuid4()),
            iteration=iteration,
        )
        try:
            return await workflow.execute_activity(
                "turnkit.model",
                call,
                result_type=ModelStep,
                start_to_close_timeout=timedelta(seconds=settings.model_timeout),
                heartbeat_timeout=timedelta(seconds=settings.model_heartbeat_timeout),
                retry_policy=RetryPolicy(
                    initial_interval=timedelta(seconds=1),
                    maximum_interval=timedelta(seconds=30),
                    maximum_attempts=settings.model_max_attempts,
                    non_retryable_error_types=["ModelError", "ConfigError", "ModelAccessError"],
                ),
                summary=f"model · {turn.agent_name} · iteration {iteration}",
            )
        except ActivityError as err:
            error_class, message = _failure(err)
            return await self._finish(turn, "failed", error_class, message)

    async def _tool(self, turn: TurnInput, call: ToolCallRef) -> ToolOutcome:
        timeout, heartbeat, retry = _tool_policy(turn.agent_name, call.name)
        try:
            return await workflow.execute_activity(
                f"tool:{call.name}",
                ToolCallInput(
                    turn_id=turn.turn_id,
                    conversation_id=turn.conversation_id,
                    root_turn_id=turn.root_turn_id,
                    agent_name=turn.agent_name,
                    call=call,
                ),
                result_type=ToolOutcome,
                start_to_close_timeout=timeout,
                heartbeat_timeout=heartbeat,
                retry_policy=retry,
                summary=f"tool {call.name}",
            )
        except ActivityError as err:
            # The attempt was lost (worker died, timed out) or the last retry failed: record that, never re-run an
            # at-most-once tool. A lost attempt's outcome is unknown; the model is told so (spec §5.8).
            lost = isinstance(err.cause, ActivityTimeoutError)
            settle = SettleToolCall(
                turn_id=turn.turn_id,
                conversation_id=turn.conversation_id,
                call=call,
                outcome="interrupted" if lost else "failed",
                message=INTERRUPTED_MESSAGE if lost else _failure(err)[1],
            )
            return await workflow.execute_activity(
                "turnkit.settle_tool",
                settle,
                result_type=ToolOutcome,
                start_to_close_timeout=STORE_TIMEOUT,
                retry_policy=STORE_RETRY,
                summary=f"settle {call.name}",
            )

    async def _finish(self, turn: TurnInput, status: str, error_class: str, message: str) -> TurnOutcome:
        finish = FinishTurn(turn_id=turn.turn_id, status=status, error_class=error_class, error_message=message)  # type: ignore[arg-type]
        return await self._finish_with(finish)

    async def _finish_with(self, finish: FinishTurn) -> TurnOutcome:
        return await workflow.execute_activity(
            "turnkit.finish_turn",
            finish,
            result_type=TurnOutcome,
            start_to_close_timeout=STORE_TIMEOUT,
            retry_policy=STORE_RETRY,
            summary=f"finish · {finish.status}",
        )


def _tool_policy(agent_name: str, tool_name: str) -> tuple[timedelta, timedelta, RetryPolicy]:
    """Timeouts and retries of one tool call, from its recovery mode (the registry is code, so replay-stable)."""
    tool = resolve_agent(agent_name).tool(tool_name)
    if tool is None:  # unknown tool: the activity records the failure at once
        return timedelta(seconds=30), timedelta(seconds=30), RetryPolicy(maximum_attempts=1)
    timeout = timedelta(seconds=tool.timeout)
    heartbeat = timedelta(seconds=min(tool.timeout, settings.tool_heartbeat_timeout))
    if tool.recovery == "replay_safe":
        retry = RetryPolicy(
            initial_interval=timedelta(seconds=tool.initial_retry_interval),
            maximum_interval=timedelta(seconds=tool.maximum_retry_interval),
            maximum_attempts=tool.max_attempts,
        )
    else:
        retry = RetryPolicy(maximum_attempts=1)  # at most once: a lost attempt is "interrupted", never re-run
    return timeout, heartbeat, retry


def _failure(err: ActivityError) -> tuple[str, str]:
    """The TurnKit error class and message behind a failed activity."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        name = cause.type or "Error"
        return (name if name.startswith("TurnKit::") else f"TurnKit::{name}" if _turnkit(name) else name), cause.message
    if isinstance(cause, ActivityTimeoutError):
        return "TurnKit::ModelError", f"activity timed out ({cause.type.name if cause.type else 'unknown'})"
    return type(cause).__name__ if cause else "Error", str(cause or err)


def _turnkit(name: str) -> bool:
    return name in {"ModelError", "ConfigError", "ModelAccessError", "BudgetError", "ToolError", "Error", "InputError"}
