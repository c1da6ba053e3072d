"""A store transaction's staged inputs: what a submission carries (text, context, principal, metadata), written before
the lane's update so that the update carries only its id."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete

import turnkit.store.statements as sql
from turnkit.kernel.errors import RecordNotFound
from turnkit.store.rows import NewRow, canonical_json, utcnow
from turnkit.store.schema import StagedInputRow
from turnkit.store.tx.base import TxBase


class StagedInputsTx(TxBase):
    """A store transaction's staged inputs."""

    async def stage_input(self, staged_id: str, *, conversation_id: str, content: dict[str, Any]) -> bool:
        """Write what a submission carries (text, context, principal, metadata) under ``staged_id``, so that the
        lane's update carries only the id (issue 8 item 12). Idempotent by id: returns whether it was created.
        """

        def build() -> NewRow:
            return NewRow(
                StagedInputRow,
                uid=staged_id,
                conversation_uid=conversation_id,
                content=canonical_json(content),
                created_at=utcnow(),
            )

        _, created = await self._get_or_create(lambda: self._read_one(sql.STAGED_BY_UID, uid=staged_id), build)
        return created

    async def load_staged_input(self, staged_id: str) -> dict[str, Any]:
        """The content staged under ``staged_id``; raises :class:`RecordNotFound` when absent."""
        row = await self._read_one(sql.STAGED_CONTENT, uid=staged_id)
        if row is None:
            raise RecordNotFound(f"staged input not found: {staged_id}")
        return dict(row.content)

    async def delete_staged_input(self, staged_id: str) -> None:
        """Drop a staged input once its message exists (a no-op when it is gone already)."""
        await self.connection.execute(sql.DELETE_STAGED, {"uid": staged_id})

    async def drop_staged_inputs(self, *, older_than: datetime) -> list[str]:
        """Delete staged inputs written before ``older_than``: orphans of submissions whose update never reached
        their lane (``turnkit repair``). Returns their ids."""
        staged = sql.STAGED_INPUTS
        rows = await self.connection.scalars(
            delete(staged).where(staged.c.created_at < older_than).returning(staged.c.uid)
        )
        return sorted(rows)
