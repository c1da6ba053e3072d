"""TurnKit: durable AI conversations on Temporal.

Turns loop model → tools → model as Temporal workflows; a SQL store keeps the record of everything.

    async with turnkit.connect() as tk:
        async with tk.worker():
            conv = await tk.conversation(agent)
            turn = await conv.ask("Hello")

From a team's own workflow, :mod:`turnkit.workflow` asks an agent as one of its steps.

The names below are loaded when first used: ``import turnkit`` (which every ``turnkit.*`` import runs first, the
workflow sandbox's included) loads no engine, store, driver or provider SDK, so workflow code that imports
:mod:`turnkit.workflow` or :mod:`turnkit.kernel` pulls in only those.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkit._lazy import lazy_exports

if TYPE_CHECKING:
    from turnkit import providers, specialists, workflow
    from turnkit.activity_tools import ActivityTool, activity_tool
    from turnkit.agent import Agent, register
    from turnkit.config import configure
    from turnkit.cost import Cost
    from turnkit.events import Event, client_event
    from turnkit.handles import Conversation, Turn
    from turnkit.kernel.errors import (
        AuthorizationError,
        BudgetError,
        CompactionError,
        ConfigError,
        Error,
        InputError,
        LostClaim,
        ModelAccessError,
        ModelError,
        OutputAudit,
        RecordNotFound,
        StoreError,
        ToolError,
        ToolValidationError,
        TransientModelError,
    )
    from turnkit.kernel.records import (
        ConversationRecord,
        DeliveryRecord,
        MediaRecord,
        MessageRecord,
        ToolExecutionRecord,
        TurnRecord,
        WaitRecord,
    )
    from turnkit.live_context import LiveContextContribution, PromptBuildContext
    from turnkit.mcp import MCPServer
    from turnkit.media import MediaInput
    from turnkit.media_calls import paint, view_media
    from turnkit.media_requests import PaintRequest, ViewMediaRequest
    from turnkit.media_tools import ImageTool, ViewMediaTool
    from turnkit.model import Client, ModelRequest, Result, ToolCall, ToolSpec, Usage
    from turnkit.model_access import validate_models
    from turnkit.output_policy import AuditResult, OutputPolicy, Violation, check_output_policy
    from turnkit.plugin import TurnKitPlugin
    from turnkit.prompt import SystemPrompt
    from turnkit.run import Run
    from turnkit.runtime import TurnKit, connect
    from turnkit.skills import Skill
    from turnkit.streaming import (
        Restart,
        SubAgentStarted,
        TextDelta,
        ThinkingDelta,
        ToolCallFinished,
        ToolCallStarted,
        TurnEnded,
        TurnStreamEvent,
    )
    from turnkit.tools import Tool, ToolContext, tool

#: Where each name of the application API is defined (``None``: the name is a submodule).
_EXPORTS: dict[str, str | None] = {
    "ActivityTool": "turnkit.activity_tools",
    "activity_tool": "turnkit.activity_tools",
    "Agent": "turnkit.agent",
    "register": "turnkit.agent",
    "configure": "turnkit.config",
    "Cost": "turnkit.cost",
    "Event": "turnkit.events",
    "client_event": "turnkit.events",
    "Conversation": "turnkit.handles",
    "Turn": "turnkit.handles",
    **dict.fromkeys(
        (
            "AuthorizationError",
            "BudgetError",
            "CompactionError",
            "ConfigError",
            "Error",
            "InputError",
            "LostClaim",
            "ModelAccessError",
            "ModelError",
            "OutputAudit",
            "RecordNotFound",
            "StoreError",
            "ToolError",
            "ToolValidationError",
            "TransientModelError",
        ),
        "turnkit.kernel.errors",
    ),
    **dict.fromkeys(
        (
            "ConversationRecord",
            "DeliveryRecord",
            "MediaRecord",
            "MessageRecord",
            "ToolExecutionRecord",
            "TurnRecord",
            "WaitRecord",
        ),
        "turnkit.kernel.records",
    ),
    "LiveContextContribution": "turnkit.live_context",
    "PromptBuildContext": "turnkit.live_context",
    "MediaInput": "turnkit.media",
    "paint": "turnkit.media_calls",
    "view_media": "turnkit.media_calls",
    "PaintRequest": "turnkit.media_requests",
    "ViewMediaRequest": "turnkit.media_requests",
    "MCPServer": "turnkit.mcp",
    "validate_models": "turnkit.model_access",
    "ImageTool": "turnkit.media_tools",
    "ViewMediaTool": "turnkit.media_tools",
    **dict.fromkeys(("Client", "ModelRequest", "Result", "ToolCall", "ToolSpec", "Usage"), "turnkit.model"),
    **dict.fromkeys(("AuditResult", "OutputPolicy", "Violation", "check_output_policy"), "turnkit.output_policy"),
    "TurnKitPlugin": "turnkit.plugin",
    "SystemPrompt": "turnkit.prompt",
    "Run": "turnkit.run",
    "TurnKit": "turnkit.runtime",
    "connect": "turnkit.runtime",
    "Skill": "turnkit.skills",
    **dict.fromkeys(
        (
            "Restart",
            "SubAgentStarted",
            "TextDelta",
            "ThinkingDelta",
            "ToolCallFinished",
            "ToolCallStarted",
            "TurnEnded",
            "TurnStreamEvent",
        ),
        "turnkit.streaming",
    ),
    "Tool": "turnkit.tools",
    "ToolContext": "turnkit.tools",
    "tool": "turnkit.tools",
    "providers": None,
    "specialists": None,
    "workflow": None,
}

__all__ = [
    "ActivityTool",
    "Agent",
    "AuditResult",
    "AuthorizationError",
    "BudgetError",
    "Client",
    "CompactionError",
    "ConfigError",
    "Conversation",
    "ConversationRecord",
    "Cost",
    "DeliveryRecord",
    "Error",
    "Event",
    "ImageTool",
    "InputError",
    "LiveContextContribution",
    "LostClaim",
    "MCPServer",
    "MediaInput",
    "MediaRecord",
    "MessageRecord",
    "ModelAccessError",
    "ModelError",
    "ModelRequest",
    "OutputAudit",
    "OutputPolicy",
    "PaintRequest",
    "PromptBuildContext",
    "RecordNotFound",
    "Restart",
    "Result",
    "Run",
    "Skill",
    "StoreError",
    "SubAgentStarted",
    "SystemPrompt",
    "TextDelta",
    "ThinkingDelta",
    "Tool",
    "ToolCall",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolContext",
    "ToolError",
    "ToolExecutionRecord",
    "ToolSpec",
    "ToolValidationError",
    "TransientModelError",
    "Turn",
    "TurnEnded",
    "TurnKit",
    "TurnKitPlugin",
    "TurnRecord",
    "TurnStreamEvent",
    "Usage",
    "ViewMediaRequest",
    "ViewMediaTool",
    "Violation",
    "WaitRecord",
    "activity_tool",
    "check_output_policy",
    "client_event",
    "configure",
    "connect",
    "paint",
    "providers",
    "register",
    "specialists",
    "tool",
    "validate_models",
    "view_media",
    "workflow",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
