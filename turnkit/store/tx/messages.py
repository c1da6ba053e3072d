"""A store transaction's messages (behaviour §2.3): appended with gap-free sequences, a turn's charge written with
its response."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Unpack

import turnkit.store.statements as sql
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.records import MessageRecord, TurnRecord
from turnkit.store.rows import (
    NewMessage,
    NewRow,
    message_record,
    new_message_row,
    prefixed,
    row_values,
    tool_result_row,
    turn_record,
    turn_values,
)
from turnkit.store.tx.base import ABSENT
from turnkit.store.tx.turns import TurnsTx


class MessagesTx(TurnsTx):
    """A store transaction's messages, appended with gap-free sequences."""

    async def append_message(self, conversation_id: str, **message: Unpack[NewMessage]) -> MessageRecord:
        """Append a message with sequence ``max + 1``, atomically with the insert (gap-free under concurrency).

        ``text`` is shorthand for ``[{"type": "text", "text": text}]``. With an ``id`` that already exists the
        stored message is returned and nothing is written. ``request_id`` marks an assistant response as the answer
        to that model request (found again with :meth:`find_response`).
        """
        row = new_message_row(conversation_id, message)
        appended, _ = await self._append(row, unless=None if message.get("id") is None else "uid")
        return appended

    async def append_message_and_update_turn(
        self, conversation_id: str, *, message: NewMessage, turn_id: str, turn_updates: dict[str, Any]
    ) -> tuple[MessageRecord, TurnRecord]:
        """:meth:`append_message` (``message``: its keyword arguments) then :meth:`update_turn` of ``turn_id``
        (``turn_updates``): the message and the turn as written.

        On PostgreSQL, with the conversation's lock held and the turn's counted values known (its row read with its
        lock), both writes are one statement (``statements.turn_update_appending``): a model call's response and its
        charge, one round trip fewer. Elsewhere, two.
        """
        row = new_message_row(conversation_id, message)
        unless: Literal["uid"] | None = None if message.get("id") is None else "uid"
        if (
            self.store.dialect != "postgresql"
            or ("conversation", conversation_id) not in self._locked
            or turn_id not in self._turn_counts
            or self.connection.in_nested_transaction()
        ):
            appended, _ = await self._append(row, unless=unless)
            return appended, await self.update_turn(turn_id, **turn_updates)
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote
        values = turn_values(turn_updates)
        other_root = await self._count_turn_change(turn_id, values)  # known: no statement
        params = {**values, "b_uid": turn_id, **prefixed("m_", row_values(row))}
        statement = sql.turn_update_appending(params, new=unless is None)
        self._forget_turn(turn_id)
        found = (await self.connection.execute(statement, params)).one_or_none()
        if found is None:
            raise RecordNotFound(f"turn not found: {turn_id}")
        self._remember_counts(found)  # the UPDATE holds the row's lock until the transaction ends
        if found.message_id is None:
            # Nothing appended: a message with the given id exists (it is returned), or the conversation is gone
            # (RecordNotFound, and the transaction's writes roll back).
            appended, _ = await self._append(row, unless=unless)
        else:
            row.id, row.sequence = found.message_id, found.message_sequence
            appended = message_record(row)
        await self._add_to_tree(*other_root)
        return appended, turn_record(found)

    async def append_tool_result(
        self,
        conversation_id: str,
        *,
        turn_id: str,
        tool_execution_id: str,
        content: Sequence[dict[str, Any]],
        metadata: dict[str, Any],
    ) -> tuple[MessageRecord, bool]:
        """Append the tool-result message of ``tool_execution_id`` (role ``tool``, kind ``tool_result``) unless the
        execution has a message already: ``(message, True)``, or ``(that message, False)`` with nothing written."""
        row = tool_result_row(conversation_id, turn_id, tool_execution_id, content, metadata)
        return await self._append(row, unless="tool_execution")

    async def _append(
        self, row: NewRow, *, unless: Literal["uid", "tool_execution"] | None
    ) -> tuple[MessageRecord, bool]:
        """Insert ``row`` with its conversation's next sequence, unless a message with its ``uid`` (or a message of its
        tool execution) exists: ``(message, created)``. Raises :class:`RecordNotFound` when the conversation is
        absent."""
        conversation_id = row.conversation_uid
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote
        # test_store fix: lock first, then look for the existing message, so that concurrent appends of one explicit
        # id (in transactions that did not lock the conversation up front) see each other instead of IntegrityError.
        await self.lock(conversation_id=conversation_id)
        statement, existing = (
            (sql.APPEND_MESSAGE, None)
            if unless is None
            else (sql.APPEND_NEW_MESSAGE, (sql.MESSAGE_BY_UID, row.uid))
            if unless == "uid"
            else (sql.APPEND_FIRST_TOOL_RESULT, (sql.TOOL_RESULT_MESSAGE, row.tool_execution_uid))
        )
        if self.store.engine.dialect.insert_returning:
            # The conversation's latest sequence, its existence, the existing message's absence and the insert in one
            # statement (issue 9); only when no row comes back, a read tells an existing message from a missing
            # conversation.
            inserted = (await self.connection.execute(statement, row_values(row))).first()
            if inserted is None:
                found = None if existing is None else await self._read_one(existing[0], uid=existing[1])
                if found is None:
                    raise RecordNotFound(f"conversation not found: {conversation_id}")
                return message_record(found), False
            row.id, row.sequence = inserted
            return message_record(row), True
        # A SQLite without INSERT … RETURNING (before 3.35): the same in two or three statements.
        if existing is not None:
            found = await self._read_one(existing[0], uid=existing[1])
            if found is not None:
                return message_record(found), False
        latest = await self._read_one(sql.CONVERSATION_AND_LATEST_SEQUENCE, uid=conversation_id)
        if latest is None:
            raise RecordNotFound(f"conversation not found: {conversation_id}")
        row.sequence = int(latest.latest or 0) + 1
        await self._insert(row)
        return message_record(row), True

    async def latest_message_sequence(self, conversation_id: str) -> int:
        """The highest sequence in the conversation, 0 when it has no messages."""
        value = await self.connection.scalar(sql.LATEST_SEQUENCE, {"uid": conversation_id})
        return int(value or 0)

    async def load_message(self, message_id: str) -> MessageRecord:
        """The message; raises :class:`RecordNotFound` when absent."""
        found = await self.find_message(message_id)
        if found is None:
            raise RecordNotFound(f"message not found: {message_id}")
        return found

    async def find_message(self, message_id: str) -> MessageRecord | None:
        """The message, or None when absent (what an idempotent write looks up before writing it under its id)."""
        row = await self._read_one(sql.MESSAGE_BY_UID, uid=message_id)
        return None if row is None else message_record(row)

    async def list_messages(
        self,
        conversation_id: str,
        *,
        through_sequence: int | None = None,
        turn_id: str | None = None,
        after_sequence: int | None = None,
    ) -> list[MessageRecord]:
        """Messages in ``sequence`` order.

        With ``through_sequence``: only rows with ``sequence <= N`` or ``turn_id == turn_id`` (a turn's frozen
        context plus its own messages, ``messages_for_turn`` in behaviour §1.3). With ``after_sequence``: rows after it.
        """
        query = sql.messages(
            through=through_sequence is not None, turn=turn_id is not None, after=after_sequence is not None
        )
        params = {"uid": conversation_id, "through": through_sequence, "turn_uid": turn_id, "after": after_sequence}
        rows = await self._read_all(query, **{key: value for key, value in params.items() if value is not None})
        return [message_record(row) for row in rows]

    async def list_turn_messages(self, turn_id: str) -> list[MessageRecord]:
        """The messages a turn wrote (its ``turn_id``), in sequence order."""
        return [message_record(row) for row in await self._read_all(sql.TURN_MESSAGES, uid=turn_id)]

    async def find_response(self, turn_id: str, request_id: str, *, kind: str | None = None) -> MessageRecord | None:
        """The assistant response a turn persisted for model request ``request_id`` (an indexed lookup), or None.

        A request may have two messages: the automatic compaction summary made before it (``kind=
        "context_summary"``) and the response itself (any other kind, the default).
        """
        if kind != "context_summary":
            looked = self._take_look("response", turn_id, request_id)
            if looked is not None:
                return None if looked is ABSENT else message_record(looked)
        query = sql.SUMMARY_FOR if kind == "context_summary" else sql.RESPONSE_TO
        row = await self._read_one(query, turn_uid=turn_id, request_uid=request_id)
        return None if row is None else message_record(row)

    async def latest_response(self, turn_id: str) -> MessageRecord | None:
        """The turn's latest assistant response to a model request (an indexed lookup), or None."""
        row = self._take_look("latest", turn_id) or await self._read_one(sql.LATEST_RESPONSE, turn_uid=turn_id)
        return None if row is None else message_record(row)

    async def tool_result_message(self, tool_execution_id: str) -> MessageRecord | None:
        """The tool-result message of an execution, if one was appended."""
        row = await self._read_one(sql.TOOL_RESULT_MESSAGE, uid=tool_execution_id)
        return None if row is None else message_record(row)
