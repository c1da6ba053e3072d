"""A store transaction's tool executions (behaviour §2.5): opened once per call, counted against the root tree's
budget, settled by compare-and-set with their result message."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select

import turnkit.store.statements as sql
from turnkit._engine.ids import new_id
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.records import (
    OPEN_EXECUTION_STATUSES,
    MessageRecord,
    ToolExecutionRecord,
    ToolExecutionStatus,
    counts_against_budget,
)
from turnkit.store.rows import (
    TOOL_EXECUTION_UPDATE_FIELDS,
    NewRow,
    canonical_json,
    check_tool_status,
    message_record,
    prefixed,
    row_values,
    rowcount,
    tool_execution_record,
    tool_result_row,
    utcnow,
)
from turnkit.store.schema import ToolExecutionRow
from turnkit.store.tx.base import ABSENT
from turnkit.store.tx.messages import MessagesTx


class ToolExecutionsTx(MessagesTx):
    """A store transaction's tool executions (behaviour §2.5), settled by compare-and-set."""

    async def create_tool_execution(
        self,
        *,
        turn_id: str,
        tool_call_id: str,
        tool_name: str,
        arguments: dict[str, Any] | None = None,
        status: str = "pending",
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        started_at: datetime | None = None,
        completed_at: datetime | None = None,
        found_absent: bool = False,
    ) -> tuple[ToolExecutionRecord, bool]:
        """Get or create the execution of ``(turn_id, tool_call_id)``. Returns ``(record, created)``.

        ``found_absent=True``: the caller found no execution for the call in this transaction (under the root turn's
        lock), so it is not looked for again (a concurrent creator is still handled, see ``_get_or_create``).
        """
        check_tool_status(status)
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote

        def build() -> NewRow:
            now = utcnow()
            return NewRow(
                ToolExecutionRow,
                uid=new_id("tool_execution"),
                turn_uid=turn_id,
                tool_call_id=tool_call_id,
                tool_name=tool_name,
                status=status,
                arguments=canonical_json(arguments or {}),
                result=None if result is None else canonical_json(result),
                error=None if error is None else canonical_json(error),
                started_at=started_at,
                completed_at=completed_at,
                created_at=now,
                updated_at=now,
            )

        if found_absent and counts_against_budget(status, error):
            counted = await self._create_counted_execution(build(), turn_id, tool_name)
            if counted is not None:
                return counted, True
        # Natural key: the unique (turn_uid, tool_call_id).
        row, created = await self._get_or_create(
            lambda: self._read_one(sql.EXECUTION_BY_CALL, turn_uid=turn_id, tool_call_id=tool_call_id),
            build,
            found_absent=found_absent,
        )
        if created and counts_against_budget(row.status, row.error):
            await self._count_execution(turn_id, tool_name, 1)
        return tool_execution_record(row), created

    async def _create_counted_execution(self, row: NewRow, turn_id: str, tool_name: str) -> ToolExecutionRecord | None:
        """PostgreSQL, with the root's tool counts read under its lock in this transaction: insert ``row`` and count it
        in one statement (``CREATE_COUNTED_EXECUTION``), one round trip per tool call fewer. None when that does not
        apply, or when a concurrent creator's row was there (nothing written or counted): the caller then takes the
        general path, which finds that row."""
        if self.store.dialect != "postgresql":
            return None
        known = self._known_tool_counts(turn_id)
        if known is None:
            return None
        root, by_name = known
        counts = {**by_name, tool_name: by_name.get(tool_name, 0) + 1}
        params = {**prefixed("e_", row_values(row)), "b_uid": root, "add_tools": 1, "by_name": counts}
        self._turn_rows.pop(root, None)  # its tree totals change
        inserted = (await self.connection.execute(sql.CREATE_COUNTED_EXECUTION, params)).scalar()
        if inserted is None:
            return None
        row.id = inserted
        self._remember_tool_counts(root, counts)
        return tool_execution_record(row)

    async def existing_call_ids(self, turn_id: str, tool_call_ids: Iterable[str]) -> set[str]:
        """Which of ``tool_call_ids`` already have an execution in the turn (an indexed lookup of those ids only)."""
        wanted = sorted({str(i) for i in tool_call_ids})
        if not wanted:
            return set()
        looked = self._take_look("calls", turn_id, *wanted)
        if looked is not None:
            return set() if looked is ABSENT else {str(i) for i in looked.ids}
        rows = await self.connection.scalars(sql.EXISTING_CALL_IDS, {"turn_uid": turn_id, "ids": wanted})
        return set(rows)

    async def find_tool_execution(self, turn_id: str, tool_call_id: str) -> ToolExecutionRecord | None:
        """The execution of ``(turn_id, tool_call_id)``, or None."""
        looked = self._take_look("execution", turn_id, tool_call_id)
        if looked is ABSENT:
            return None
        row = looked or await self._read_one(sql.EXECUTION_BY_CALL, turn_uid=turn_id, tool_call_id=tool_call_id)
        return None if row is None else tool_execution_record(row)

    async def load_tool_execution(self, execution_id: str) -> ToolExecutionRecord:
        """The execution; raises :class:`RecordNotFound` when absent."""
        row = await self._read_one(sql.EXECUTION_BY_UID, uid=execution_id)
        if row is None:
            raise RecordNotFound(f"tool execution not found: {execution_id}")
        return tool_execution_record(row)

    async def claim_tool_execution(
        self,
        execution_id: str,
        *,
        from_: ToolExecutionStatus | Iterable[ToolExecutionStatus] = "running",
        to: ToolExecutionStatus = "completed",
        **attrs: Any,
    ) -> ToolExecutionRecord | None:
        """Compare-and-set an execution's status (first commit wins). None when the CAS lost."""
        expected = [from_] if isinstance(from_, str) else list(from_)
        for status in [*expected, to]:
            check_tool_status(status)
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote
        unknown = set(attrs) - TOOL_EXECUTION_UPDATE_FIELDS
        if unknown:
            raise ValueError(f"unknown tool execution update attributes: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {"status": to, "updated_at": utcnow()}
        for key, value in attrs.items():
            values[key] = canonical_json(value) if key in ("result", "error") and value is not None else value
        # Whether the execution counted against the budget before: pending and running ones always do (they carry
        # no error); from any other status, read it (its row locked, so the count cannot drift).
        counted_before = True
        if not set(expected) <= {"pending", "running"}:
            await self.lock_tool_execution(execution_id)
            old = await self._read_one(sql.EXECUTION_COUNTED, uid=execution_id)
            counted_before = old is None or counts_against_budget(old.status, old.error)
        params = {**values, "b_uid": execution_id, "b_expected": expected}
        if self.store.engine.dialect.update_returning:  # the row as written: no second SELECT (issue 9)
            row = (await self.connection.execute(sql.CLAIM_EXECUTION_RETURNING, params)).one_or_none()
            if row is None:
                return None
            settled = tool_execution_record(row)
        else:
            if rowcount(await self.connection.execute(sql.CLAIM_EXECUTION, params)) == 0:
                return None
            settled = await self.load_tool_execution(execution_id)
        delta = int(settled.counts_against_budget) - int(counted_before)
        await self._count_execution(settled.turn_id, settled.tool_name, delta)
        return settled

    async def complete_tool_execution(
        self,
        execution: ToolExecutionRecord,
        *,
        conversation_id: str,
        result: dict[str, Any],
        completed_at: datetime,
        result_message: Callable[[ToolExecutionRecord], tuple[list[dict[str, Any]], dict[str, Any]]],
    ) -> tuple[ToolExecutionRecord, MessageRecord, bool] | None:
        """Compare-and-set an open (pending or running) execution to ``completed`` with ``result`` and, when that won,
        append its tool-result message to ``conversation_id`` (as :meth:`append_tool_result`): ``(the execution as
        written, the message, created)``, or None when the compare-and-set lost (nothing written). ``result_message``
        gives the message's content and metadata for the execution as written; ``created`` is False when the
        execution had its message already (that one is returned).

        The caller holds the root turn's lock and the conversation's (an append's lock). On PostgreSQL both writes
        are one statement (``COMPLETE_EXECUTION_WITH_RESULT``): one round trip per tool call fewer.
        """
        if self.store.dialect != "postgresql" or ("conversation", conversation_id) not in self._locked:
            settled = await self.claim_tool_execution(
                execution.id, from_=OPEN_EXECUTION_STATUSES, to="completed", result=result, completed_at=completed_at
            )
            if settled is None:
                return None
            content, metadata = result_message(settled)
            message, created = await self.append_tool_result(
                conversation_id,
                turn_id=execution.turn_id,
                tool_execution_id=execution.id,
                content=content,
                metadata=metadata,
            )
            return settled, message, created
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote
        stored, now = canonical_json(result), utcnow()
        # The execution as the compare-and-set writes it (the JSON as stored): its message is built before the
        # statement that writes both, and is the one the execution as read back would give.
        written = execution.model_copy(
            update={"status": "completed", "result": stored, "completed_at": completed_at, "updated_at": now}
        )
        row = tool_result_row(conversation_id, execution.turn_id, execution.id, *result_message(written))
        params = {
            **prefixed("m_", row_values(row)),
            "b_uid": execution.id,
            "b_expected": list(OPEN_EXECUTION_STATUSES),
            "s_status": "completed",
            "s_result": stored,
            "s_completed_at": completed_at,
            "s_updated_at": now,
        }
        found = (await self.connection.execute(sql.COMPLETE_EXECUTION_WITH_RESULT, params)).first()
        if found is None:
            return None
        settled = tool_execution_record(found)
        # Open executions count against the budget; a completed one without an error still does (no change).
        await self._count_execution(settled.turn_id, settled.tool_name, int(settled.counts_against_budget) - 1)
        if found.message_id is None:
            # Nothing appended: the execution had its message already, or the conversation is gone; the append
            # returns the first, raises RecordNotFound for the second.
            message, created = await self._append(row, unless="tool_execution")
            return settled, message, created
        row.id, row.sequence = found.message_id, found.message_sequence
        return settled, message_record(row), True

    async def lock_tool_execution(self, execution_id: str) -> None:
        """Lock an execution row until the transaction ends (a no-op on SQLite)."""
        if self.store.dialect == "postgresql":
            await self.connection.execute(sql.LOCK_EXECUTION, {"uid": execution_id})

    async def list_tool_executions(
        self, *, turn_id: str | None = None, root_turn_id: str | None = None
    ) -> list[ToolExecutionRecord]:
        """Executions of one turn, or of every turn in a root tree, ordered by ``created_at, id``."""
        executions = sql.TOOL_EXECUTIONS.c
        query = sql.whole_rows(ToolExecutionRow)
        if turn_id is not None:
            query = query.where(executions.turn_uid == turn_id)
        if root_turn_id is not None:
            tree = select(sql.TURNS.c.uid).where(sql.TURNS.c.root_turn_uid == root_turn_id)
            query = query.where(executions.turn_uid.in_(tree))
        rows = await self._read_all(query.order_by(executions.created_at, executions.id))
        return [tool_execution_record(row) for row in rows]
