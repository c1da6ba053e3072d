"""A store transaction's waits (behaviour §2.7): a turn waiting on another."""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Row

import turnkit.store.statements as sql
from turnkit.kernel.records import WaitRecord
from turnkit.store.rows import NewRow, utcnow, wait_record
from turnkit.store.schema import WaitRow
from turnkit.store.tx.base import TxBase


class WaitsTx(TxBase):
    """A store transaction's waits (behaviour §2.7): a turn waiting on another."""

    async def create_wait(self, *, turn_id: str, target_turn_id: str) -> tuple[WaitRecord, bool]:
        """Create the edge ``turn_id → target_turn_id`` (idempotent). Returns ``(record, created)``."""

        async def find() -> Row[Any] | None:
            return await self._read_one(sql.WAIT_EDGE, turn_uid=turn_id, target_turn_uid=target_turn_id)

        def build() -> NewRow:
            now = utcnow()
            return NewRow(WaitRow, turn_uid=turn_id, target_turn_uid=target_turn_id, created_at=now, updated_at=now)

        row, created = await self._get_or_create(find, build)
        return wait_record(row), created

    async def list_waits(self, *, turn_id: str | None = None, target_turn_id: str | None = None) -> list[WaitRecord]:
        """Wait edges matching the filters, in creation order."""
        if (turn_id is None) != (target_turn_id is None):  # the hot cases: one filter, a prebuilt statement
            query = sql.WAITS_OF_TURN if turn_id is not None else sql.WAITS_ON_TARGET
            return [
                wait_record(row) for row in await self.connection.execute(query, {"uid": turn_id or target_turn_id})
            ]
        waits = sql.WAITS.c
        query = sql.whole_rows(WaitRow)
        if turn_id is not None:
            query = query.where(waits.turn_uid == turn_id)
        if target_turn_id is not None:
            query = query.where(waits.target_turn_uid == target_turn_id)
        return [wait_record(row) for row in await self._read_all(query.order_by(waits.id))]
