"""A store row's values in and out: records built from rows, new rows built from records' values, and the
checks and conversions on the way (turnkit/store/store.py runs the statements).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final, Required, TypedDict

from sqlalchemy import Column, Insert, Table, inspect
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Row
from sqlalchemy.sql.schema import ColumnDefault

from turnkit._engine.ids import new_id
from turnkit.kernel.records import (
    MESSAGE_KINDS,
    MESSAGE_ROLES,
    TOOL_EXECUTION_STATUSES,
    TURN_STATUSES,
    ConversationRecord,
    DeliveryRecord,
    MediaRecord,
    MessageRecord,
    ToolExecutionRecord,
    TurnRecord,
    WaitRecord,
)
from turnkit.kernel.turn_state import TurnOptions
from turnkit.store.schema import (
    Base,
    ConversationRow,
    DeliveryRow,
    MediaRow,
    MessageRow,
    ToolExecutionRow,
    TurnRow,
    WaitRow,
)
from turnkit.store.storable import storable, storable_text

__all__ = [
    "DELIVERY_UPDATE_FIELDS",
    "TOOL_EXECUTION_UPDATE_FIELDS",
    "TURN_UPDATE_FIELDS",
    "NewMessage",
    "NewRow",
    "canonical_json",
    "check_tool_status",
    "check_turn_status",
    "conversation_record",
    "delivery_record",
    "insert_columns",
    "insert_skipping_conflicts",
    "iterations_of",
    "media_id_for",
    "media_record",
    "message_record",
    "money",
    "new_message_row",
    "prefixed",
    "row_values",
    "rowcount",
    "str_or_none",
    "tool_counts_of",
    "tool_execution_record",
    "tool_result_row",
    "turn_record",
    "turn_values",
    "utcnow",
    "wait_record",
]

TURN_UPDATE_FIELDS: Final = frozenset(
    {
        "status",
        "options",
        "usage",
        "cost",
        "error",
        "output_text",
        "output_data",
        "submitted_at",
        "claim_token",
        "started_at",
        "heartbeat_at",
        "completed_at",
    }
)
TOOL_EXECUTION_UPDATE_FIELDS: Final = frozenset({"status", "result", "error", "started_at", "completed_at"})
DELIVERY_UPDATE_FIELDS: Final = frozenset({"message_id", "delivered_at"})


def utcnow() -> datetime:
    """The current time in UTC (store timestamps are always aware UTC)."""
    return datetime.now(UTC)


def canonical_json(value: Any) -> Any:
    """A JSON deep copy with string keys, so that equal payloads compare equal (spec T76).

    It is also storable on every backend alike (issue 8 items 1, 11): NaN and infinities become null, NUL and lone
    surrogates U+FFFD (see :func:`turnkit.store.storable.storable`); a circular value raises ``UnstorableValue``.
    """
    return storable(value)


class NewMessage(TypedDict, total=False):
    """A message to append (:meth:`StoreTx.append_message`'s arguments after the conversation's id)."""

    role: Required[str]
    kind: str  # "text" when not given
    content: Sequence[dict[str, Any]] | None
    text: str | None
    turn_id: str | None
    tool_execution_id: str | None
    metadata: dict[str, Any] | None
    id: str | None
    request_id: str | None


def media_id_for(sha256: str) -> str:
    """The id of the media item whose bytes have this SHA-256 hex digest."""
    return f"media_{sha256[:24]}"


def media_record(row: MediaRow | Row[Any] | NewRow) -> MediaRecord:
    """The record of a media row."""
    return MediaRecord(
        id=row.uid, mime_type=row.mime_type, byte_size=row.byte_size, sha256=row.sha256, filename=row.filename
    )


# Row → record conversion -----------------------------------------------------------------------------------------
#
# A row's JSON values are taken as they are: read from the database, they were decoded by the store's engines into
# what canonical_json makes (storable.stored_json); built here for a write, they were made canonical on the way in.


def conversation_record(row: ConversationRow | Row[Any] | NewRow) -> ConversationRecord:
    """The record of a conversation row."""
    subject = None if row.subject_type is None else {"type": row.subject_type, "id": row.subject_id}
    return ConversationRecord(
        id=row.uid,
        agent_name=row.agent_name,
        model=row.model,
        subject=subject,
        # A copy: a committed conversation's row is kept for the store's later transactions (Store.conversation_rows),
        # and a record's caller may change what it was given.
        metadata=canonical_json(row.metadata_),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def message_record(row: MessageRow | Row[Any] | NewRow) -> MessageRecord:
    """The record of a message row."""
    return MessageRecord(
        id=row.uid,
        conversation_id=row.conversation_uid,
        turn_id=row.turn_uid,
        role=row.role,  # type: ignore[arg-type]
        kind=row.kind,  # type: ignore[arg-type]
        sequence=row.sequence,
        content=row.content,
        tool_execution_id=row.tool_execution_uid,
        provider_message_id=row.provider_message_id,
        metadata=row.metadata_,
        created_at=row.created_at,
    )


def turn_record(row: TurnRow | Row[Any] | NewRow) -> TurnRecord:
    """The record of a turn row."""
    return TurnRecord(
        id=row.uid,
        conversation_id=row.conversation_uid,
        agent_name=row.agent_name,
        parent_turn_id=row.parent_turn_uid,
        parent_tool_execution_id=row.parent_tool_execution_uid,
        root_turn_id=row.root_turn_uid,
        context_message_sequence=row.context_message_sequence,
        status=row.status,  # type: ignore[arg-type]
        model=row.model,
        options=TurnOptions.model_validate(row.options),
        usage=row.usage,
        cost=None if row.cost is None else float(row.cost),
        error=row.error,
        output_text=row.output_text,
        output_data=row.output_data,
        submitted_at=row.submitted_at,
        claim_token=row.claim_token,
        started_at=row.started_at,
        heartbeat_at=row.heartbeat_at,
        completed_at=row.completed_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def tool_execution_record(row: ToolExecutionRow | Row[Any] | NewRow) -> ToolExecutionRecord:
    """The record of a tool execution row."""
    return ToolExecutionRecord(
        id=row.uid,
        turn_id=row.turn_uid,
        tool_call_id=row.tool_call_id,
        tool_name=row.tool_name,
        status=row.status,  # type: ignore[arg-type]
        arguments=row.arguments,
        result=row.result,
        error=row.error,
        started_at=row.started_at,
        completed_at=row.completed_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def delivery_record(row: DeliveryRow | Row[Any] | NewRow) -> DeliveryRecord:
    """The record of a delivery row."""
    return DeliveryRecord(
        id=row.uid,
        source_conversation_id=row.source_conversation_uid,
        destination_conversation_id=row.destination_conversation_uid,
        source_turn_id=row.source_turn_uid,
        key=row.key,
        payload=row.payload,
        message_id=row.message_uid,
        delivered_at=row.delivered_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def wait_record(row: WaitRow | Row[Any] | NewRow) -> WaitRecord:
    """The record of a wait row."""
    return WaitRecord(turn_id=row.turn_uid, target_turn_id=row.target_turn_uid, created_at=row.created_at)


# New rows and their values --------------------------------------------------------------------------------------------


def check_turn_status(status: str) -> None:
    """Raise ``ValueError`` for a status that is no turn status."""
    if status not in TURN_STATUSES:
        raise ValueError(f"unknown turn status: {status}")


def check_tool_status(status: str) -> None:
    """Raise ``ValueError`` for a status that is no tool execution status."""
    if status not in TOOL_EXECUTION_STATUSES:
        raise ValueError(f"unknown tool execution status: {status}")


def turn_values(attrs: dict[str, Any]) -> dict[str, Any]:
    """The column values of a turn update (``updated_at`` included), its attributes checked and made storable."""
    unknown = set(attrs) - TURN_UPDATE_FIELDS
    if unknown:
        raise ValueError(f"unknown turn update attributes: {', '.join(sorted(unknown))}")
    if "status" in attrs:
        check_turn_status(attrs["status"])
    values: dict[str, Any] = {}
    for key, value in attrs.items():
        if key == "options" and isinstance(value, TurnOptions):
            value = canonical_json(value.stored())
        elif key in ("options", "usage", "error", "output_data") and value is not None:
            value = canonical_json(value)
        elif key == "output_text" and isinstance(value, str):
            value = storable_text(value)  # a text column: NUL would fail on PostgreSQL (issue 8 item 1)
        elif key == "cost" and value is not None:
            value = Decimal(str(round(float(value), 6)))
        values[key] = value
    values["updated_at"] = utcnow()
    return values


def new_message_row(conversation_id: str, message: NewMessage) -> NewRow:
    """The row of a message :meth:`StoreTx.append_message` appends (its arguments checked)."""
    role, kind = message["role"], message.get("kind", "text")
    if role not in MESSAGE_ROLES:
        raise ValueError(f"unknown message role: {role}")
    if kind not in MESSAGE_KINDS:
        raise ValueError(f"unknown message kind: {kind}")
    content, text = message.get("content"), message.get("text")
    parts = [dict(part) for part in content] if content is not None else []
    if text is not None:
        parts.append({"type": "text", "text": text})
    parts = [part if "type" in part else {"type": "text", **part} for part in parts]
    return _message_row(
        conversation_id,
        role=role,
        kind=kind,
        parts=parts,
        turn_id=message.get("turn_id"),
        tool_execution_id=message.get("tool_execution_id"),
        metadata=message.get("metadata"),
        id=message.get("id"),
        request_id=message.get("request_id"),
    )


def _message_row(
    conversation_id: str,
    *,
    role: str,
    kind: str,
    parts: list[dict[str, Any]],
    turn_id: str | None,
    tool_execution_id: str | None,
    metadata: dict[str, Any] | None,
    id: str | None = None,
    request_id: str | None = None,
) -> NewRow:
    """A new message's row, its sequence left to the append (which binds every column but ``id`` and ``sequence``)."""
    now = utcnow()
    return NewRow(
        MessageRow,
        uid=id or new_id("message"),
        conversation_uid=conversation_id,
        turn_uid=turn_id,
        role=role,
        kind=kind,
        content=canonical_json(parts),
        tool_execution_uid=tool_execution_id,
        provider_message_id=None,
        metadata_=canonical_json(metadata or {}),
        request_uid=request_id,
        created_at=now,
        updated_at=now,
    )


def tool_result_row(
    conversation_id: str,
    turn_id: str,
    tool_execution_id: str,
    content: Sequence[dict[str, Any]],
    metadata: dict[str, Any],
) -> NewRow:
    """The row of an execution's tool-result message (role ``tool``, kind ``tool_result``)."""
    parts = [dict(part) for part in content]
    return _message_row(
        conversation_id,
        role="tool",
        kind="tool_result",
        parts=parts,
        turn_id=turn_id,
        tool_execution_id=tool_execution_id,
        metadata=metadata,
    )


class NewRow:
    """A row about to be inserted into ``mapped``'s table: its values as attributes, by attribute key (``metadata_``),
    read by :func:`row_values` for the INSERT and by the record builders once it is in.

    Not an instance of the mapped class: that class's constructor sends each value through SQLAlchemy's attribute
    instrumentation (a set event per column, a state lookup per read), for an object no session ever tracks.
    """

    def __init__(self, mapped: type[Base], **values: Any) -> None:
        self.__dict__.update(values)
        self.mapped = mapped

    def __getattr__(self, name: str) -> Any:  # only for a value it was not given
        if name in _column_keys(self.mapped):
            return None  # a column with no default, left out: NULL, as the mapped class's instance would say
        raise AttributeError(f"{self.mapped.__name__} has no column {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:  # what the INSERT generated: id, sequence
        self.__dict__[name] = value


def prefixed(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each key prefixed (the binds of a fused statement, ``turnkit/store/statements.py``)."""
    return {prefix + key: value for key, value in values.items()}


@functools.cache
def _column_keys(mapped: type[Any]) -> frozenset[str]:
    return frozenset(key for key, _ in insert_columns(mapped)[1])


def row_values(row: NewRow) -> dict[str, Any]:
    """The column values of a new row, by column key: the attributes it was given, and the column defaults it was not
    (set on the row too, so that it carries the row as inserted)."""
    state = row.__dict__
    values: dict[str, Any] = {}
    for key, column in insert_columns(row.mapped)[1]:
        if key in state:
            values[column.key] = state[key]
        elif isinstance(column.default, ColumnDefault) and not column.primary_key:
            default: Any = column.default.arg
            value = default(None) if callable(default) else default  # a callable default takes the context
            setattr(row, key, value)
            values[column.key] = value
    return values


@functools.cache
def insert_skipping_conflicts(mapped: type[Any]) -> Insert:
    """A mapped class's ``INSERT … ON CONFLICT DO NOTHING RETURNING <primary key>`` (PostgreSQL), built once."""
    mapper = inspect(mapped)
    table: Table = mapper.local_table
    return postgresql.insert(table).on_conflict_do_nothing().returning(*mapper.primary_key)


@functools.cache
def insert_columns(mapped: type[Any]) -> tuple[Insert, tuple[tuple[str, Column[Any]], ...], Insert]:
    """A mapped class's INSERT (built once: its compiled form is cached), its ``(attribute key, column)`` pairs, and
    the INSERT with ``RETURNING <primary key>``, for :meth:`StoreTx._insert`."""
    mapper = inspect(mapped)
    table: Table = mapper.local_table
    columns = tuple((attr.key, attr.columns[0]) for attr in mapper.column_attrs)
    return table.insert(), columns, table.insert().returning(*mapper.primary_key)


def money(value: Any) -> Decimal:
    """A cost as the store keeps it: a Decimal with 6 places (0 for None)."""
    return Decimal(0) if value is None else Decimal(str(round(float(value), 6)))


def tool_counts_of(by_name: dict[str, Any] | None) -> dict[str, int]:
    """A root's by-name tool execution counts as stored (a JSON map)."""
    return {str(k): int(v) for k, v in (by_name or {}).items()}


def iterations_of(options: Any) -> int:
    """A turn's model iterations from its ``options`` (``options.state.iterations``, behaviour §6.3)."""
    state = (options or {}).get("state") if isinstance(options, dict) else None
    return int((state or {}).get("iterations", 0) or 0) if isinstance(state, dict) else 0  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]


def rowcount(result: Any) -> int:
    """The rows a write statement's result reports it changed (0 when it reports none)."""
    return int(getattr(result, "rowcount", 0) or 0)


def str_or_none(value: Any) -> str | None:
    """``value`` as a string, None kept."""
    return None if value is None else str(value)
