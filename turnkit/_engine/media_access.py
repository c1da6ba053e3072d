"""Which stored media a turn may use by id (behaviour §3.12): only media its own conversation's tree has seen.

Media are content-addressed and shared by every conversation, so an id alone proves nothing about who may read the
bytes: a model (or a prompt injected into it) could name another tenant's image. A turn may therefore use a media
id only when a message of a conversation in its root tree carries it as media (a ``media`` or ``image`` part, or an
analysis's ``media``; an id merely written in text or a tool call's arguments is no proof): the turn's own
conversation and those of the turns delegated from the same root (sub-agents' conversations and their parent's).
Any other id is answered like an unknown one, ``RecordNotFound "media not found: <id>"``, so that whether another
tree's item exists is not revealed. Bytes given directly (a ``MediaInput``) are the caller's own and need no such check.
"""

from __future__ import annotations

from typing import Any

from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.records import MediaRecord, TurnRecord
from turnkit.store.store import StoreTx

__all__ = ["usable_media"]


async def usable_media(tx: StoreTx, turn: TurnRecord, media_id: str) -> MediaRecord:
    """The media item ``media_id`` when ``turn``'s tree may use it (see the module docstring).

    Raises:
        RecordNotFound: ``"media not found: <id>"``: no such item, or none that this turn's tree has seen.
    """
    record = await tx.load_media(media_id)  # an unknown id fails here, before any scan
    conversations = {turn.conversation_id}
    conversations.update(t.conversation_id for t in await tx.list_turns(root_turn_id=turn.root_turn_id))
    for conversation_id in sorted(conversations):
        for message in await tx.list_messages(conversation_id):
            if _references(message.content, media_id):
                return record
    raise RecordNotFound(f"media not found: {media_id}")


def _references(content: list[dict[str, Any]], media_id: str) -> bool:
    """Whether a message's parts reference ``media_id`` as media: a ``media`` or ``image`` part, or an analysis's
    ``media``. Text that merely names the id (a tool call's arguments, a result) is no reference: anyone can type it."""
    for part in content:
        kind = part.get("type")
        if kind in ("media", "image") and part.get("media_id") == media_id:
            return True
        if kind == "media_analysis" and (part.get("media") or {}).get("media_id") == media_id:
            return True
    return False
