"""TurnKit: durable AI conversations on Temporal.

Turns loop model → tools → model as Temporal workflows; a SQL store keeps the record of everything.

    async with turnkit.connect() as tk:
        async with tk.worker():
            conv = await tk.conversation(agent)
            turn = await conv.ask("Hello")
"""

from __future__ import annotations

from turnkit import providers, specialists
from turnkit.agent import Agent, register, registered_agents, resolve_agent
from turnkit.config import Settings, configure, settings
from turnkit.cost import Cost
from turnkit.errors import (
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
from turnkit.events import Event
from turnkit.handles import Conversation, Turn
from turnkit.live_context import LiveContextContribution, PromptBuildContext
from turnkit.media import MediaInput
from turnkit.media_calls import paint, view_media
from turnkit.media_requests import PaintRequest, ViewMediaRequest
from turnkit.media_tools import ImageTool, ViewMediaTool
from turnkit.model import Client, ModelRequest, Result, ToolCall, ToolSpec, Usage
from turnkit.output_policy import AuditResult, OutputPolicy, Violation, check_output_policy
from turnkit.plugin import TurnKitPlugin
from turnkit.prompt import SystemPrompt
from turnkit.records import (
    ConversationRecord,
    DeliveryRecord,
    MediaRecord,
    MessageRecord,
    ToolExecutionRecord,
    TurnRecord,
    WaitRecord,
)
from turnkit.run import Run
from turnkit.runtime import TurnKit, connect
from turnkit.skills import Skill
from turnkit.store import Store
from turnkit.tools import Tool, ToolContext, tool

__all__ = [
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
    "Result",
    "Run",
    "Settings",
    "Skill",
    "Store",
    "StoreError",
    "SystemPrompt",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "ToolExecutionRecord",
    "ToolSpec",
    "ToolValidationError",
    "TransientModelError",
    "Turn",
    "TurnKit",
    "TurnKitPlugin",
    "TurnRecord",
    "Usage",
    "ViewMediaRequest",
    "ViewMediaTool",
    "Violation",
    "WaitRecord",
    "check_output_policy",
    "configure",
    "connect",
    "paint",
    "providers",
    "register",
    "registered_agents",
    "resolve_agent",
    "settings",
    "specialists",
    "tool",
    "view_media",
]
