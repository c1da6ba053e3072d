"""A store transaction's media: content-addressed images and other files that messages refer to."""

from __future__ import annotations

import hashlib

import turnkit.store.statements as sql
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.records import MediaRecord
from turnkit.store.rows import NewRow, media_id_for, media_record, utcnow
from turnkit.store.schema import MediaRow
from turnkit.store.tx.base import TxBase


class MediaTx(TxBase):
    """A store transaction's media: content-addressed images and other files that messages refer to."""

    async def put_media(self, data: bytes, *, mime_type: str, filename: str | None = None) -> MediaRecord:
        """Store media bytes and return their reference. Content-addressed, so idempotent: equal bytes have one row
        (the first writer's ``mime_type`` and ``filename`` stay)."""
        digest = hashlib.sha256(data).hexdigest()
        media_id = media_id_for(digest)

        def build() -> NewRow:
            return NewRow(
                MediaRow,
                uid=media_id,
                mime_type=mime_type,
                byte_size=len(data),
                sha256=digest,
                filename=filename,
                data=bytes(data),
                created_at=utcnow(),
            )

        row, _ = await self._get_or_create(lambda: self._read_one(sql.MEDIA_BY_UID, uid=media_id), build)
        return media_record(row)

    async def load_media(self, media_id: str) -> MediaRecord:
        """The reference of a stored media item; raises :class:`RecordNotFound` when absent."""
        # Only the columns of the reference: the bytes are not read.
        found = await self._read_one(sql.MEDIA_REFERENCE, uid=media_id)
        if found is None:
            raise RecordNotFound(f"media not found: {media_id}")
        return MediaRecord(
            id=found.uid,
            mime_type=found.mime_type,
            byte_size=found.byte_size,
            sha256=found.sha256,
            filename=found.filename,
        )

    async def load_media_data(self, media_id: str) -> bytes:
        """The bytes of a stored media item; raises :class:`RecordNotFound` when absent."""
        data = await self.connection.scalar(sql.MEDIA_DATA, {"uid": media_id})
        if data is None:
            raise RecordNotFound(f"media not found: {media_id}")
        return bytes(data)
