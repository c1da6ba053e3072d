"""Built-in coordination tools (spec §4.3), opt-in: add them to an agent's ``tools``.

Coordination tools hold no external effect of their own: their durability comes from delivery keys and child ids,
so the runtime executes them itself (inside the tool activity, with the store and the Temporal client) instead of
calling ``call``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from turnkit.tools import Tool

__all__ = ["CoordinationTool", "SendMessageTool", "send_message"]


class CoordinationTool(Tool):
    """A tool the runtime executes itself (see the module docstring)."""

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.name} is executed by the TurnKit runtime, not called directly")


class SendMessageTool(CoordinationTool):
    """Send a message to another conversation; it is delivered durably and wakes that conversation if idle."""

    name = "send_message"
    description = "Send a text message to another conversation. It is delivered durably, exactly once."
    usage_hint = "Use when another agent's conversation must be told something or asked to act."

    class Arguments(BaseModel):
        conversation_id: str = Field(description="The id of the destination conversation (conv_…).")
        text: str = Field(description="The message to deliver.")


#: Ready-made instance: ``Agent(..., tools=[send_message])``.
send_message = SendMessageTool()
