"""The TurnKit record model (behaviour §2): plain, JSON-compatible pydantic records.

The store returns these; applications read them. They are copies: changing one never changes the store.
Field names follow the spec (``*_id``); the SQL columns behind them are ``*_uid`` (behaviour §2.10).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Final, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from turnkit.kernel.turn_state import TurnOptions, TurnState, changeable_copy

__all__ = [
    "ACTIVE_TURN_STATUSES",
    "CANCELLABLE_TURN_STATUSES",
    "CANCELLED_CLASS",
    "CANCELLED_MESSAGE",
    "INTERRUPTED_MESSAGE",
    "MESSAGE_KINDS",
    "MESSAGE_ROLES",
    "OPEN_EXECUTION_STATUSES",
    "TERMINAL_TOOL_EXECUTION_STATUSES",
    "TERMINAL_TURN_STATUSES",
    "TOOL_EXECUTION_STATUSES",
    "TURN_STATUSES",
    "UNPAUSED_TURN_STATUSES",
    "WORKING_TURN_STATUSES",
    "ActiveTurnStatus",
    "ConversationRecord",
    "DeliveryRecord",
    "MediaRecord",
    "MessageRecord",
    "OpenExecutionStatus",
    "TerminalExecutionStatus",
    "TerminalTurnStatus",
    "ToolExecutionRecord",
    "ToolExecutionStatus",
    "TreeUsage",
    "TurnRecord",
    "TurnStatus",
    "WaitRecord",
    "WorkingTurnStatus",
    "counts_against_budget",
    "message_text",
]

#: A turn that has not finished: queued or running, waiting on other turns, or paused by a human.
ActiveTurnStatus = Literal["pending", "waiting", "paused", "running"]
#: An active turn at work: queued for its next step or running one (neither waiting on other turns nor paused).
WorkingTurnStatus = Literal["pending", "running"]
#: The terminal set used for waits, callbacks and cancellation (behaviour §1.6). ``stale`` is not in it.
TerminalTurnStatus = Literal["completed", "failed", "cancelled"]
TurnStatus = Literal[ActiveTurnStatus, TerminalTurnStatus, "stale"]
#: A tool execution whose outcome is not known yet.
OpenExecutionStatus = Literal["pending", "running"]
TerminalExecutionStatus = Literal["completed", "failed", "cancelled", "interrupted"]
ToolExecutionStatus = Literal[OpenExecutionStatus, TerminalExecutionStatus]

# Every status set is derived from the Literals above (issue 9: one place to change a status).
TURN_STATUSES: Final[tuple[TurnStatus, ...]] = get_args(TurnStatus)
ACTIVE_TURN_STATUSES: Final[tuple[ActiveTurnStatus, ...]] = get_args(ActiveTurnStatus)
WORKING_TURN_STATUSES: Final[tuple[WorkingTurnStatus, ...]] = get_args(WorkingTurnStatus)
#: Active and not paused: what a pause, or a model call's claim, moves a turn from.
UNPAUSED_TURN_STATUSES: Final[tuple[ActiveTurnStatus, ...]] = tuple(s for s in ACTIVE_TURN_STATUSES if s != "paused")
TERMINAL_TURN_STATUSES: Final[tuple[TerminalTurnStatus, ...]] = get_args(TerminalTurnStatus)
#: Every status but the terminal ones (``stale`` included): what a cancellation moves a turn from.
CANCELLABLE_TURN_STATUSES: Final[tuple[TurnStatus, ...]] = tuple(
    s for s in TURN_STATUSES if s not in TERMINAL_TURN_STATUSES
)
TOOL_EXECUTION_STATUSES: Final[tuple[ToolExecutionStatus, ...]] = get_args(ToolExecutionStatus)
OPEN_EXECUTION_STATUSES: Final[tuple[OpenExecutionStatus, ...]] = get_args(OpenExecutionStatus)
TERMINAL_TOOL_EXECUTION_STATUSES: Final[tuple[TerminalExecutionStatus, ...]] = get_args(TerminalExecutionStatus)
MESSAGE_ROLES: Final = ("user", "assistant", "tool")
MESSAGE_KINDS: Final = ("text", "tool_call", "tool_result", "context_summary", "image", "media_analysis")

#: What the model is told when a tool's outcome is unknown (behaviour §5.8).
#: The error of a turn cancelled by the application (``Turn.cancel``): the store's record and the workflow's result.
CANCELLED_CLASS: Final = "TurnKit::Cancelled"
CANCELLED_MESSAGE: Final = "cancelled by application"
INTERRUPTED_MESSAGE: Final = (
    "Tool execution was interrupted before a result was recorded. It is unknown whether the operation ran; "
    "do not assume it did or did not."
)

_RECORD_CONFIG = ConfigDict(frozen=False, extra="forbid")


class ConversationRecord(BaseModel):
    """A durable thread bound to one agent name (behaviour §2.2)."""

    model_config = _RECORD_CONFIG

    id: str
    agent_name: str
    model: str | None = None
    subject: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    updated_at: datetime


class MessageRecord(BaseModel):
    """One transcript entry with its per-conversation, gap-free sequence (behaviour §2.3)."""

    model_config = _RECORD_CONFIG

    id: str
    conversation_id: str
    turn_id: str | None = None
    role: Literal["user", "assistant", "tool"]
    kind: Literal["text", "tool_call", "tool_result", "context_summary", "image", "media_analysis"]
    sequence: int
    content: list[dict[str, Any]] = Field(default_factory=list)
    tool_execution_id: str | None = None
    provider_message_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime

    @property
    def text(self) -> str:
        """The ``text`` parts joined with a newline; thinking, provider and tool parts are left out."""
        return message_text(self.content)


class TurnRecord(BaseModel):
    """One unit of agent work in a conversation (behaviour §2.4)."""

    model_config = _RECORD_CONFIG

    id: str
    conversation_id: str
    agent_name: str
    parent_turn_id: str | None = None
    parent_tool_execution_id: str | None = None
    root_turn_id: str
    context_message_sequence: int = 0
    status: TurnStatus = "pending"
    model: str | None = None
    options: TurnOptions = Field(default_factory=TurnOptions)
    usage: dict[str, Any] = Field(default_factory=dict)
    cost: float | None = None
    error: dict[str, Any] | None = None
    output_text: str | None = None
    output_data: Any = None
    submitted_at: datetime | None = None
    claim_token: str | None = None
    started_at: datetime | None = None
    heartbeat_at: datetime | None = None
    completed_at: datetime | None = None
    created_at: datetime
    updated_at: datetime

    @property
    def terminal(self) -> bool:
        """True once the turn is completed, failed or cancelled."""
        return self.status in TERMINAL_TURN_STATUSES

    @property
    def deadline(self) -> datetime | None:
        """When the tree of this (root) turn times out: its submission plus its ``timeout`` limit (None: never)."""
        limits = self.options.budget_limits
        if limits is None or limits.timeout is None or self.submitted_at is None:
            return None
        return self.submitted_at + timedelta(seconds=float(limits.timeout))

    @property
    def state(self) -> TurnState:
        """The turn loop's state (``options.state``), a copy to change and write back."""
        return changeable_copy(self.options.state)


class TreeUsage(BaseModel):
    """What a root tree has used of its budgets (behaviour §6.3): the running totals kept on the root turn's row.

    Always equal to the sums over the tree's records (:meth:`from_records`); the store updates them in the
    transaction of every write they count, so reading them is one row however large the tree is.
    """

    model_config = _RECORD_CONFIG

    iterations: int = 0
    tool_executions: int = 0
    tool_executions_by_name: dict[str, int] = Field(default_factory=dict)
    cost: float = 0.0

    @classmethod
    def from_records(cls, tree: Sequence[TurnRecord], executions: Sequence[ToolExecutionRecord] = ()) -> TreeUsage:
        """The usage summed over a tree's turns and tool executions (behaviour §6.3 seeding from records)."""
        by_name: dict[str, int] = {}
        counted = [execution for execution in executions if execution.counts_against_budget]
        for execution in counted:
            by_name[execution.tool_name] = by_name.get(execution.tool_name, 0) + 1
        return cls(
            iterations=sum(turn.options.state.iterations for turn in tree),
            tool_executions=len(counted),
            tool_executions_by_name=by_name,
            cost=float(sum(Decimal(str(turn.cost or 0)) for turn in tree)),
        )


class ToolExecutionRecord(BaseModel):
    """One durable record per tool-call id the model proposed in a turn (behaviour §2.5)."""

    model_config = _RECORD_CONFIG

    id: str
    turn_id: str
    tool_call_id: str
    tool_name: str
    status: ToolExecutionStatus = "pending"
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None
    created_at: datetime
    updated_at: datetime

    @property
    def idempotency_key(self) -> str:
        """The key a replay-safe tool must honour: the same on every attempt (behaviour §2.5)."""
        return f"turnkit:tool:{self.id}"

    @property
    def counts_against_budget(self) -> bool:
        """Whether this execution uses tool budget (see :func:`counts_against_budget`)."""
        return counts_against_budget(self.status, self.error)


def counts_against_budget(status: str, error: Mapping[str, Any] | None) -> bool:
    """Whether an execution in ``status`` with ``error`` uses tool budget: all but cancelled and budget-denied ones
    (behaviour §6.3)."""
    if status == "cancelled":
        return False
    details = (error or {}).get("details") or {}
    return not (isinstance(details, Mapping) and details.get("budget_denied"))  # pyright: ignore[reportUnknownMemberType]


class DeliveryRecord(BaseModel):
    """A durable, idempotent message from one conversation to another (behaviour §2.6)."""

    model_config = _RECORD_CONFIG

    id: str
    source_conversation_id: str
    destination_conversation_id: str
    source_turn_id: str | None = None
    key: str
    payload: dict[str, Any] = Field(default_factory=dict)
    message_id: str | None = None
    delivered_at: datetime | None = None
    created_at: datetime
    updated_at: datetime


class WaitRecord(BaseModel):
    """A durable dependency edge: ``turn_id`` cannot proceed until ``target_turn_id`` is terminal (behaviour §2.7)."""

    model_config = _RECORD_CONFIG

    turn_id: str
    target_turn_id: str
    created_at: datetime


def message_text(content: list[dict[str, Any]]) -> str:
    """Join the ``text`` parts of a message's content with newlines (behaviour §2.3 ``Message#text``)."""
    return "\n".join(str(part.get("text", "")) for part in content if part.get("type", "text") == "text")


class MediaRecord(BaseModel):
    """A stored media item's reference: what messages, tool results and payloads carry instead of its bytes.

    The bytes stay in the store (``StoreTx.load_media_data``); ``id`` is ``media_`` + the first 24 hex characters of
    the SHA-256 of the bytes, so equal bytes have one id.
    """

    model_config = _RECORD_CONFIG

    id: str
    mime_type: str
    byte_size: int
    sha256: str
    filename: str | None = None

    def reference(self) -> dict[str, Any]:
        """The JSON reference ``{media_id, mime_type, byte_size, sha256, filename?}``."""
        ref: dict[str, Any] = {
            "media_id": self.id,
            "mime_type": self.mime_type,
            "byte_size": self.byte_size,
            "sha256": self.sha256,
        }
        if self.filename:
            ref["filename"] = self.filename
        return ref
