"""A store transaction's deliveries (behaviour §2.6): messages between conversations, created once per key."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import turnkit.store.statements as sql
from turnkit._engine.ids import new_id
from turnkit.kernel.errors import RecordNotFound, ToolError
from turnkit.kernel.records import DeliveryRecord
from turnkit.store.rows import NewRow, canonical_json, delivery_record, rowcount, utcnow
from turnkit.store.schema import DeliveryRow
from turnkit.store.tx.base import TxBase


class DeliveriesTx(TxBase):
    """A store transaction's deliveries (behaviour §2.6): messages between conversations, created once per key."""

    async def create_delivery(
        self,
        *,
        source_conversation_id: str,
        destination_conversation_id: str,
        key: str,
        payload: dict[str, Any],
        source_turn_id: str | None = None,
    ) -> tuple[DeliveryRecord, bool]:
        """Create a delivery, idempotent by its globally unique ``key``. Returns ``(record, created)``.

        The same key with the same route and payload returns the original; anything else raises ``ToolError``
        without revealing the other payload (behaviour §2.9).
        """
        if not key:
            raise ValueError("delivery key is required")
        payload = canonical_json(payload)

        def build() -> NewRow:
            now = utcnow()
            return NewRow(
                DeliveryRow,
                uid=new_id("delivery"),
                source_conversation_uid=source_conversation_id,
                destination_conversation_uid=destination_conversation_id,
                source_turn_uid=source_turn_id,
                key=key,
                payload=payload,
                created_at=now,
                updated_at=now,
            )

        existing, created = await self._get_or_create(lambda: self._read_one(sql.DELIVERY_BY_KEY, key=key), build)
        if created:
            return delivery_record(existing), True
        same = (
            existing.source_conversation_uid == source_conversation_id
            and existing.destination_conversation_uid == destination_conversation_id
            and existing.source_turn_uid == source_turn_id
            and existing.payload == payload
        )
        if not same:
            raise ToolError("delivery key is already used for a different message")
        return delivery_record(existing), False

    async def find_delivery(self, key: str) -> DeliveryRecord | None:
        """The delivery with this idempotency key, or None."""
        row = await self._read_one(sql.DELIVERY_BY_KEY, key=key)
        return None if row is None else delivery_record(row)

    async def load_delivery(self, delivery_id: str) -> DeliveryRecord:
        """The delivery; raises :class:`RecordNotFound` when absent."""
        row = await self._read_one(sql.DELIVERY_BY_UID, uid=delivery_id)
        if row is None:
            raise RecordNotFound(f"delivery not found: {delivery_id}")
        return delivery_record(row)

    async def mark_delivered(self, delivery_id: str, *, message_id: str) -> DeliveryRecord | None:
        """Compare-and-set ``delivered_at`` from NULL. None when it was already delivered."""
        now = utcnow()
        result = await self.connection.execute(
            sql.MARK_DELIVERED,
            {"b_uid": delivery_id, "message_uid": message_id, "delivered_at": now, "updated_at": now},
        )
        if rowcount(result) == 0:
            return None
        return await self.load_delivery(delivery_id)

    async def list_deliveries(
        self,
        *,
        source_conversation_id: str | None = None,
        destination_conversation_id: str | None = None,
        pending: bool = False,
        limit: int | None = None,
        since: datetime | None = None,
    ) -> list[DeliveryRecord]:
        """Deliveries matching the filters, ordered by ``created_at, id``; ``since``: created or changed since then."""
        deliveries = sql.DELIVERIES.c
        query = sql.whole_rows(DeliveryRow)
        if since is not None:
            query = query.where(deliveries.updated_at >= since)
        if source_conversation_id is not None:
            query = query.where(deliveries.source_conversation_uid == source_conversation_id)
        if destination_conversation_id is not None:
            query = query.where(deliveries.destination_conversation_uid == destination_conversation_id)
        if pending:
            query = query.where(deliveries.delivered_at.is_(None))
        query = query.order_by(deliveries.created_at, deliveries.id)
        if limit is not None:
            query = query.limit(limit)
        return [delivery_record(row) for row in await self._read_all(query)]
