"""SQL schema of the TurnKit record model (behaviour §2.10), as SQLAlchemy 2 typed declarative models.

Every record has an integer primary key plus its TurnKit id in a unique ``uid`` column, and every ``*_id`` field of
the record model is a ``*_uid`` column, as in the gem's install migration. The Alembic migration in
``turnkit/store/migrations`` creates exactly these tables; ``tests/test_store_schema.py`` checks that they agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from turnkit.kernel.asks import MAX_CALLER_WORKFLOW_ID

__all__ = [
    "TABLE_PREFIX",
    "Base",
    "ConversationRow",
    "DeliveryRow",
    "MediaRow",
    "MessageRow",
    "StagedInputRow",
    "ToolExecutionRow",
    "TurnRow",
    "UTCDateTime",
    "WaitRow",
]

TABLE_PREFIX = "turnkit"


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite stores naive values; we re-attach UTC on read)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        value = value.astimezone(UTC)
        # SQLite has no time zones: store naive UTC so that text comparisons order correctly.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


#: JSON everywhere; JSONB on PostgreSQL (indexable, compact, and equality-comparable).
Json = JSON().with_variant(JSONB(), "postgresql")

_naming = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    """Declarative base for the TurnKit tables."""

    metadata = MetaData(naming_convention=_naming)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: Json, list[Any]: Json}


class _Timestamps:
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


# SQLite only auto-increments INTEGER PRIMARY KEY columns; BigInteger elsewhere.
_PK = BigInteger().with_variant(Integer(), "sqlite")


class ConversationRow(_Timestamps, Base):
    """``turnkit_conversations``: one durable thread bound to an agent name."""

    __tablename__ = f"{TABLE_PREFIX}_conversations"
    __table_args__ = (Index(f"ix_{TABLE_PREFIX}_conversations_subject", "subject_type", "subject_id"),)

    id: Mapped[int] = mapped_column(_PK, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    agent_name: Mapped[str] = mapped_column(String(255), nullable=False)
    model: Mapped[str | None] = mapped_column(String(255))
    subject_type: Mapped[str | None] = mapped_column(String(255))
    subject_id: Mapped[str | None] = mapped_column(String(255))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", Json, nullable=False, default=dict)


class MessageRow(_Timestamps, Base):
    """``turnkit_messages``: append-only transcript entries with gap-free per-conversation sequences."""

    __tablename__ = f"{TABLE_PREFIX}_messages"
    __table_args__ = (
        Index(f"uq_{TABLE_PREFIX}_messages_conversation_sequence", "conversation_uid", "sequence", unique=True),
        Index(f"ix_{TABLE_PREFIX}_messages_conversation_turn", "conversation_uid", "turn_uid"),
        Index(f"ix_{TABLE_PREFIX}_messages_turn", "turn_uid"),
        Index(f"ix_{TABLE_PREFIX}_messages_tool_execution", "tool_execution_uid"),
        Index(f"ix_{TABLE_PREFIX}_messages_turn_request", "turn_uid", "request_uid"),
    )

    id: Mapped[int] = mapped_column(_PK, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    conversation_uid: Mapped[str] = mapped_column(String(64), nullable=False)
    turn_uid: Mapped[str | None] = mapped_column(String(64))
    role: Mapped[str] = mapped_column(String(32), nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    sequence: Mapped[int] = mapped_column(Integer, nullable=False)
    content: Mapped[list[Any]] = mapped_column(Json, nullable=False, default=list)
    tool_execution_uid: Mapped[str | None] = mapped_column(String(64))
    provider_message_id: Mapped[str | None] = mapped_column(String(255))
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", Json, nullable=False, default=dict)
    #: The model request an assistant response answers (``metadata.request_id``), or that an automatic compaction
    #: summary was made for (``metadata.compaction.request_id``), indexed with ``turn_uid`` so that a retried model
    #: call finds what it committed without listing the turn's messages (issue 9).
    request_uid: Mapped[str | None] = mapped_column(String(64))


class TurnRow(_Timestamps, Base):
    """``turnkit_turns``: one model → tools → model loop and its outcome."""

    __tablename__ = f"{TABLE_PREFIX}_turns"
    __table_args__ = (
        # With the status: an idle conversation's unfinished turn is found without reading its finished ones.
        Index(f"ix_{TABLE_PREFIX}_turns_conversation_status", "conversation_uid", "status"),
        Index(f"ix_{TABLE_PREFIX}_turns_root", "root_turn_uid"),
        Index(f"ix_{TABLE_PREFIX}_turns_status_heartbeat", "status", "heartbeat_at"),
        Index(f"index_{TABLE_PREFIX}_turns_on_maintenance", "status", "submitted_at", "updated_at"),
    )

    id: Mapped[int] = mapped_column(_PK, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    conversation_uid: Mapped[str] = mapped_column(String(64), nullable=False)
    agent_name: Mapped[str] = mapped_column(String(255), nullable=False)
    parent_turn_uid: Mapped[str | None] = mapped_column(String(64))
    parent_tool_execution_uid: Mapped[str | None] = mapped_column(String(64))
    root_turn_uid: Mapped[str] = mapped_column(String(64), nullable=False)
    context_message_sequence: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    status: Mapped[str] = mapped_column(String(32), nullable=False, default="pending")
    model: Mapped[str | None] = mapped_column(String(255))
    options: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    usage: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    cost: Mapped[Decimal | None] = mapped_column(Numeric(14, 6))
    error: Mapped[dict[str, Any] | None] = mapped_column(Json)
    output_text: Mapped[str | None] = mapped_column(Text)
    output_data: Mapped[Any] = mapped_column(Json, nullable=True)
    submitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    claim_token: Mapped[str | None] = mapped_column(String(64))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Started by ``ask`` without the conversation's lane: a fresh conversation's first turn (docs/design.md, "A fresh
    # conversation's first turn"). A lane that meets it active runs it before anything of its own.
    direct: Mapped[bool] = mapped_column(Boolean, nullable=False, default=False, server_default=false())
    # Running totals of the root tree (behaviour §6.3), kept on the root turn's row by the store in the transaction of
    # each write they count, so a budget check reads one row instead of the whole tree (issue 9). Always equal to
    # the sums over the records: model iterations (``options.state.iterations``), counted tool executions (by name
    # too) and cost. Zero on non-root rows.
    tree_iterations: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    tree_tool_executions: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    tree_tool_executions_by_name: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    tree_cost: Mapped[Decimal] = mapped_column(Numeric(14, 6), nullable=False, default=Decimal(0))


class ToolExecutionRow(_Timestamps, Base):
    """``turnkit_tool_executions``: one row per (turn, tool-call id)."""

    __tablename__ = f"{TABLE_PREFIX}_tool_executions"
    __table_args__ = (
        Index(f"uq_{TABLE_PREFIX}_tool_executions_turn_call", "turn_uid", "tool_call_id", unique=True),
        Index(f"ix_{TABLE_PREFIX}_tool_executions_turn_status", "turn_uid", "status"),
    )

    id: Mapped[int] = mapped_column(_PK, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    turn_uid: Mapped[str] = mapped_column(String(64), nullable=False)
    tool_call_id: Mapped[str] = mapped_column(String(255), nullable=False)
    tool_name: Mapped[str] = mapped_column(String(255), nullable=False)
    status: Mapped[str] = mapped_column(String(32), nullable=False, default="pending")
    arguments: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    result: Mapped[dict[str, Any] | None] = mapped_column(Json)
    error: Mapped[dict[str, Any] | None] = mapped_column(Json)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class DeliveryRow(_Timestamps, Base):
    """``turnkit_deliveries``: idempotent (by globally unique ``key``) messages between conversations."""

    __tablename__ = f"{TABLE_PREFIX}_deliveries"
    __table_args__ = (
        Index(f"ix_{TABLE_PREFIX}_deliveries_source", "source_conversation_uid", "created_at"),
        Index(f"ix_{TABLE_PREFIX}_deliveries_destination", "destination_conversation_uid", "delivered_at"),
        Index(f"{TABLE_PREFIX}_deliveries_on_pending", "delivered_at", "created_at"),
    )

    id: Mapped[int] = mapped_column(_PK, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    source_conversation_uid: Mapped[str] = mapped_column(String(64), nullable=False)
    destination_conversation_uid: Mapped[str] = mapped_column(String(64), nullable=False)
    source_turn_uid: Mapped[str | None] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(512), nullable=False, unique=True)
    payload: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    message_uid: Mapped[str | None] = mapped_column(String(64))
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WaitRow(_Timestamps, Base):
    """``turnkit_waits``: "turn X cannot proceed until turn Y is terminal"."""

    __tablename__ = f"{TABLE_PREFIX}_waits"
    __table_args__ = (
        Index(f"uq_{TABLE_PREFIX}_waits_turn_target", "turn_uid", "target_turn_uid", unique=True),
        Index(f"ix_{TABLE_PREFIX}_waits_target", "target_turn_uid"),
    )

    id: Mapped[int] = mapped_column(_PK, primary_key=True, autoincrement=True)
    #: The waiting turn, or a team's workflow that asked the target (``turnkit.workflow``), by its workflow id.
    turn_uid: Mapped[str] = mapped_column(String(MAX_CALLER_WORKFLOW_ID), nullable=False)
    target_turn_uid: Mapped[str] = mapped_column(String(64), nullable=False)


class StagedInputRow(Base):
    """``turnkit_staged_inputs``: what an ``ask`` submits (text, context, principal, metadata), written before the
    lane's ``submit`` update so that the update carries only its id (issue 8 item 12).

    The ``turnkit.submit_turn`` activity reads it and deletes it in the transaction that creates the message and the
    turn. A row whose update never reached the lane is an orphan nothing reads.
    """

    __tablename__ = f"{TABLE_PREFIX}_staged_inputs"

    id: Mapped[int] = mapped_column(_PK, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    conversation_uid: Mapped[str] = mapped_column(String(64), nullable=False)
    content: Mapped[dict[str, Any]] = mapped_column(Json, nullable=False, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)


class MediaRow(Base):
    """``turnkit_media``: the bytes of images and other media, kept out of workflow payloads and histories.

    Content-addressed: the id is derived from the bytes' SHA-256, so storing the same bytes twice (a retried
    activity, the same image given to two turns) finds the existing row. Messages and payloads carry only the
    reference ``{media_id, mime_type, byte_size, sha256, filename}`` (docs/design.md "Images and media").
    """

    __tablename__ = f"{TABLE_PREFIX}_media"

    id: Mapped[int] = mapped_column(_PK, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), nullable=False, unique=True)
    mime_type: Mapped[str] = mapped_column(String(255), nullable=False)
    byte_size: Mapped[int] = mapped_column(BigInteger, nullable=False)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False)
    filename: Mapped[str | None] = mapped_column(String(1024))
    data: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), nullable=False)
