"""A store transaction's conversation records (behaviour §2.2)."""

from __future__ import annotations

from typing import Any

import turnkit.store.statements as sql
from turnkit._engine.ids import new_id
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.records import ConversationRecord
from turnkit.store.rows import NewRow, canonical_json, conversation_record, str_or_none, utcnow
from turnkit.store.schema import ConversationRow
from turnkit.store.tx.base import TxBase


class ConversationsTx(TxBase):
    """A store transaction's conversation records (behaviour §2.2)."""

    async def create_conversation(
        self,
        *,
        agent_name: str,
        model: str | None = None,
        subject: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        id: str | None = None,
    ) -> ConversationRecord:
        """Create a conversation; with an ``id`` that already exists, return the existing record."""
        if not agent_name:
            raise ValueError("agent_name is required")
        uid = id or new_id("conversation")

        def build() -> NewRow:
            now = utcnow()
            return NewRow(
                ConversationRow,
                uid=uid,
                agent_name=agent_name,
                model=model,
                subject_type=None if subject is None else str_or_none(subject.get("type")),
                subject_id=None if subject is None else str_or_none(subject.get("id")),
                metadata_=canonical_json(metadata or {}),
                created_at=now,
                updated_at=now,
            )

        row, created = await self._get_or_create(
            lambda: self._read_one(sql.CONVERSATION_BY_UID, uid=uid), build, look_first=id is not None
        )
        if created:
            self._created_conversations.add(uid)  # not committed yet: the store does not keep it (load_conversation)
        return conversation_record(row)

    async def load_conversation(self, conversation_id: str) -> ConversationRecord:
        """The conversation; raises :class:`RecordNotFound` when absent."""
        row = self._conversation_rows.get(conversation_id) or self.store.conversation_rows.get(conversation_id)
        if row is None:
            row = await self._read_one(sql.CONVERSATION_BY_UID, uid=conversation_id)
            if row is None:
                raise RecordNotFound(f"conversation not found: {conversation_id}")
            self._remember_conversation(row)
        return conversation_record(row)
