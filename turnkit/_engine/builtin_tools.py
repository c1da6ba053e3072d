"""Built-in coordination tools (behaviour §4.3), opt-in: add them to an agent's ``tools``.

Coordination tools hold no external effect of their own: their durability comes from delivery keys and child ids,
so the runtime executes them itself (inside the tool activity, with the store and the Temporal client) instead of
calling ``call``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from turnkit.tools import Tool

__all__ = [
    "CoordinationTool",
    "LaunchAgentTool",
    "SendMessageTool",
    "SubAgentTool",
    "WaitForTool",
    "launch_agent",
    "send_message",
    "sub_agent_tool",
    "wait_for",
]


class CoordinationTool(Tool):
    """A tool the runtime executes itself (see the module docstring)."""

    def call(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.name} is executed by the TurnKit runtime, not called directly")


class SendMessageTool(CoordinationTool):
    """Send a message to another conversation; it is delivered durably and wakes that conversation if idle."""

    name = "send_message"
    description = "Send a text message to another conversation. It is delivered durably, exactly once."
    usage_hint = "Use when another agent's conversation must be told something or asked to act."
    #: A store write and a signal: quick, so it runs inside the turn's workflow task (docs/design.md, "Local tool
    #: calls").
    local = True

    class Arguments(BaseModel):
        conversation_id: str = Field(description="The id of the destination conversation (conv_…).")
        text: str = Field(description="The message to deliver.")


#: Ready-made instance: ``Agent(..., tools=[send_message])``.
send_message = SendMessageTool()


class SubAgentTool(CoordinationTool):
    """Delegation to a sub-agent (behaviour §4.3): runs a child turn in a new child conversation and returns its result.

    Build one per sub-agent with :func:`sub_agent_tool`; the runtime runs the child as a child workflow, and
    consecutive sub-agent calls in one model response run in parallel.
    """

    usage_hint = "Use when work can be delegated independently; give the complete task and all context it needs."

    class Arguments(BaseModel):
        task: str = Field(description="The complete task for the sub-agent, including all relevant context")


def sub_agent_tool(name: str, description: str = "") -> SubAgentTool:
    """The delegation tool of the sub-agent ``name`` (its description, or "Delegate work to <name>.")."""
    cls = type(
        f"SubAgent_{name}",
        (SubAgentTool,),
        {"name": name, "description": description or f"Delegate work to {name}.", "__module__": __name__},
    )
    return cls()


class LaunchAgentTool(CoordinationTool):
    """Start one of the agent's sub-agents as an independent child turn and return its ids at once (opt-in)."""

    name = "launch_agent"
    description = (
        "Launch one of your sub-agents on a task without waiting for it. Returns its conversation and turn ids; "
        "with callback, its result is delivered to this conversation when it finishes."
    )

    class Arguments(BaseModel):
        agent_name: str = Field(description="Which sub-agent to launch.")
        task: str = Field(description="The complete task for the sub-agent, including all relevant context")
        callback: bool = Field(default=False, description="Deliver the result to this conversation when done.")


class WaitForTool(CoordinationTool):
    """Wait until other turns have finished, then return their results (opt-in)."""

    name = "wait_for"
    description = "Wait until the given turns have finished, then return their results."

    class Arguments(BaseModel):
        turn_ids: list[str] = Field(description="Ids of the turns to wait for (turn_…).")


#: Ready-made instances: ``Agent(..., tools=[launch_agent, wait_for])``.
launch_agent = LaunchAgentTool()
wait_for = WaitForTool()
