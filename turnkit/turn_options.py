"""The options a turn persists when it is built (spec §1.4), in one place for every way a turn is created."""

from __future__ import annotations

from typing import Any

from turnkit.agent import Agent
from turnkit.turn_state import BudgetLimits, TurnControls, TurnOptions

__all__ = ["turn_options"]


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
) -> TurnOptions:
    """``options`` of a new turn: limits snapshotted now, thinking (an explicit None disables it), context, and
    the optional keys only when they are set."""
    options: dict[str, Any] = {
        "trigger_message_id": trigger_message_id,
        "budget_limits": BudgetLimits.model_validate(agent.budget_limits()),
        "thinking": thinking if thinking_set else agent.thinking,
        "context": context,
    }
    optional = {
        "output_schema": output_schema or agent.output_schema,
        "prompt_mode": prompt_mode,
        "principal": principal,
        "callback_conversation_id": callback_conversation_id,
        "depth": depth,
    }
    options.update({key: value for key, value in optional.items() if value is not None})
    if paused:
        options["controls"] = TurnControls(pause_requested=True)
    return TurnOptions.model_validate(options)
