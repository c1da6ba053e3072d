"""The options a turn persists when it is built (behaviour §1.4), in one place for every way a turn is created."""

from __future__ import annotations

from typing import Any

from turnkit._engine.limits import check_limits
from turnkit.agent import Agent
from turnkit.kernel.errors import ConfigError, InputError
from turnkit.kernel.turn_state import BudgetLimits, TurnControls, TurnOptions

__all__ = ["BUDGET_LIMITS", "check_budget", "turn_options"]

#: The limits a per-turn ``budget`` may set (behaviour §6.1).
BUDGET_LIMITS = (
    "max_iterations",
    "timeout",
    "max_depth",
    "max_tool_executions",
    "max_tool_executions_by_name",
    "max_spend",
)


def check_budget(budget: dict[str, Any] | None) -> dict[str, Any]:
    """A per-turn budget's limits (None values dropped: they keep the agent's).

    Raises:
        InputError: An unknown limit name, or a value no turn can run under.
    """
    if budget is None:
        return {}
    if not isinstance(budget, dict):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InputError(f"budget must be a mapping of limits, not {type(budget).__name__}")
    unknown = sorted(str(name) for name in budget if name not in BUDGET_LIMITS)
    if unknown:
        raise InputError(f"unknown budget limit: {', '.join(unknown)} (known: {', '.join(BUDGET_LIMITS)})")
    limits = {name: value for name, value in budget.items() if value is not None}
    try:
        check_limits(limits)
    except ConfigError as err:
        raise InputError(f"budget: {err}") from err
    if "max_tool_executions_by_name" in limits:
        limits["max_tool_executions_by_name"] = {str(k): v for k, v in limits["max_tool_executions_by_name"].items()}
    return limits


def turn_options(
    agent: Agent,
    *,
    trigger_message_id: str,
    context: dict[str, Any],
    principal: Any = None,
    thinking: dict[str, Any] | None = None,
    thinking_set: bool = False,
    output_schema: dict[str, Any] | None = None,
    prompt_mode: str | None = None,
    callback_conversation_id: str | None = None,
    depth: int | None = None,
    paused: bool = False,
    compact: bool | None = None,
    budget: dict[str, Any] | None = None,
    task_queue: str | None = None,
) -> TurnOptions:
    """``options`` of a new turn: limits snapshotted now (``budget`` merged over the agent's), thinking (an explicit
    None disables it), context, and the optional keys (``compact`` among them) only when they are set."""
    options: dict[str, Any] = {
        "trigger_message_id": trigger_message_id,
        "budget_limits": BudgetLimits.model_validate({**agent.budget_limits(), **check_budget(budget)}),
        "thinking": thinking if thinking_set else agent.thinking,
        "context": context,
    }
    optional = {
        "output_schema": output_schema or agent.output_schema,
        "prompt_mode": prompt_mode,
        "principal": principal,
        "callback_conversation_id": callback_conversation_id,
        "depth": depth,
        "compact": compact,
        "task_queue": task_queue,
    }
    options.update({key: value for key, value in optional.items() if value is not None})
    if paused:
        options["controls"] = TurnControls(pause_requested=True)
    return TurnOptions.model_validate(options)
