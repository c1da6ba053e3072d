"""What a tool may do to the record: :class:`ToolStore`, a tool call's ``ToolContext.store`` (behaviour §5.4).

A tool never gets the worker's store. It gets this view of it, bound to its own execution: reads pass through, and
every write (a message, a delivery, media bytes) commits only while the execution is still open and its turn has not
ended, checked under the root turn's lock in the write's own transaction. Cancellation, the settling of an
interrupted call and a turn's end take that lock too, so a write either commits before the call was revoked or is
refused with :class:`~turnkit.kernel.errors.LostClaim` and writes nothing. An external call the tool already made
cannot be recalled; only TurnKit's record is fenced.

Every write is idempotent across the attempts of one execution: a message's id is derived from the execution and a
key (by default the write's ordinal in the attempt), a delivery's key is namespaced by the execution, and media are
content-addressed. So a replay-safe tool whose retried attempt writes the same things in the same order writes
nothing twice.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

from turnkit._engine.authorization import check
from turnkit._engine.deliveries import create_delivery
from turnkit._engine.media_access import usable_media
from turnkit._engine.validation import check_id, check_json, check_key, check_text
from turnkit.kernel.errors import LostClaim
from turnkit.kernel.records import (
    OPEN_EXECUTION_STATUSES,
    ConversationRecord,
    DeliveryRecord,
    MediaRecord,
    MessageRecord,
    ToolExecutionRecord,
    TurnRecord,
)
from turnkit.media import media_part
from turnkit.store.store import Store, StoreTx

__all__ = ["Fence", "ToolStore", "execution_fence", "fence_execution", "unfenced"]

#: Checks, inside the write's transaction, that the writer may still write (raises LostClaim otherwise).
Fence = Callable[[StoreTx], Awaitable[None]]
#: Wakes a delivery's destination after its row committed (the store is the truth; reconcile repairs a lost one).
Signal = Callable[[DeliveryRecord], Awaitable[None]]

#: Part types a tool may put in a message: its words and references to stored media (the rest are the engine's).
_TOOL_PART_TYPES: Final = frozenset({"text", "media"})
#: Each tool store's worker store, held here rather than on the object.
_WORKER_STORES: Final[weakref.WeakKeyDictionary[ToolStore, Store]] = weakref.WeakKeyDictionary()


async def fence_execution(tx: StoreTx, execution_id: str) -> ToolExecutionRecord:
    """Raise :class:`LostClaim` unless the execution is open (pending or running) and its turn has not ended.

    Call it under the root turn's lock, in the transaction of the write it guards.
    """
    execution = await tx.load_tool_execution(execution_id)
    if execution.status not in OPEN_EXECUTION_STATUSES:
        raise LostClaim(f"tool execution {execution_id} is {execution.status}: its writes are fenced")
    turn = await tx.load_turn(execution.turn_id)
    # Cancellation interrupts the turn's open executions in the transaction that ends it; the turn is checked as well
    # so that no path that ends a turn can leave one of its calls able to write.
    if turn.terminal or turn.status == "stale":
        raise LostClaim(f"tool execution {execution_id}'s turn is {turn.status}: its writes are fenced")
    return execution


def execution_fence(execution_id: str) -> Fence:
    """:func:`fence_execution` as a :data:`Fence` (for writes that take a fence, e.g. a tool's media message)."""

    async def fence(tx: StoreTx) -> None:
        await fence_execution(tx, execution_id)

    return fence


class ToolStore:
    """The record as one tool call may read and change it: ``ToolContext.store``.

    Reads pass through. Writes go to the call's own conversation (a message), to another conversation only as a
    delivery (asked as ``send_message``), or to the media table, and each is fenced by the call's execution: after
    the execution was completed, failed, cancelled or interrupted, or its turn ended, it raises :class:`LostClaim`
    and writes nothing.
    """

    def __init__(
        self,
        store: Store,
        *,
        turn_id: str,
        conversation_id: str,
        root_turn_id: str,
        execution_id: str,
        principal: Any = None,
        signal: Signal | None = None,
    ) -> None:
        """Bind ``store`` to one execution (the tool activity builds it; an application never needs to)."""
        _WORKER_STORES[self] = store  # kept off the object: nothing a tool can read from it is the raw store
        self._signal = signal
        self.turn_id = turn_id
        self.conversation_id = conversation_id
        self.root_turn_id = root_turn_id
        self.execution_id = execution_id
        self.principal = principal
        self._writes = 0
        self._put: set[str] = set()  # media this call stored: usable in its messages before any message shows them

    def __repr__(self) -> str:
        """Name the execution whose fence guards the writes."""
        return f"<ToolStore execution={self.execution_id}>"

    # -- reads ----------------------------------------------------------------------------------------------------

    async def load_turn(self, turn_id: str) -> TurnRecord:
        """The turn ``turn_id``; raises ``RecordNotFound`` when absent."""
        return await _worker_store(self).load_turn(turn_id)

    async def load_conversation(self, conversation_id: str) -> ConversationRecord:
        """The conversation ``conversation_id``; raises ``RecordNotFound`` when absent."""
        return await _worker_store(self).load_conversation(conversation_id)

    async def list_messages(
        self, conversation_id: str, *, through_sequence: int | None = None, turn_id: str | None = None
    ) -> list[MessageRecord]:
        """Messages of a conversation in sequence order."""
        return await _worker_store(self).list_messages(
            conversation_id, through_sequence=through_sequence, turn_id=turn_id
        )

    async def load_message(self, message_id: str) -> MessageRecord:
        """The message ``message_id``; raises ``RecordNotFound`` when absent."""
        async with _worker_store(self).reads() as tx:
            return await tx.load_message(message_id)

    async def list_tool_executions(
        self, *, turn_id: str | None = None, root_turn_id: str | None = None
    ) -> list[ToolExecutionRecord]:
        """Tool executions of a turn (or of a whole root tree), in creation order."""
        return await _worker_store(self).list_tool_executions(turn_id=turn_id, root_turn_id=root_turn_id)

    async def load_tool_execution(self, execution_id: str) -> ToolExecutionRecord:
        """The tool execution ``execution_id``; raises ``RecordNotFound`` when absent."""
        async with _worker_store(self).reads() as tx:
            return await tx.load_tool_execution(execution_id)

    async def load_media(self, media_id: str) -> MediaRecord:
        """A stored media item's reference; raises ``RecordNotFound`` when absent."""
        async with _worker_store(self).reads() as tx:
            return await tx.load_media(media_id)

    async def load_media_data(self, media_id: str) -> bytes:
        """A stored media item's bytes; raises ``RecordNotFound`` when absent."""
        async with _worker_store(self).reads() as tx:
            return await tx.load_media_data(media_id)

    # -- fenced writes --------------------------------------------------------------------------------------------

    async def append_message(
        self,
        conversation_id: str | None = None,
        /,
        *,
        role: str = "user",
        text: str | None = None,
        content: Sequence[Mapping[str, Any]] | None = None,
        metadata: Mapping[str, Any] | None = None,
        key: str | None = None,
    ) -> MessageRecord:
        """Append a user message to the call's conversation, fenced by the call.

        The message's metadata carries ``tool_execution_id``. Its id is derived from the execution and ``key`` (by
        default the ordinal of this write in the attempt), so a retried attempt finds the message it wrote before
        and writes nothing.

        Args:
            conversation_id: The call's own conversation (the default); any other is refused: a tool reaches another
                conversation with :meth:`deliver`.
            role: ``"user"``: a tool speaks into the conversation as input, never as the model or as a tool result.
            text: The text (or give ``content``).
            content: Parts of type ``text`` or ``media``. A ``media`` part names a ``media_id`` that this call
                stored (:meth:`put_media`) or that a message of the turn's tree already shows (behaviour §3.12); it
                is stored as that item's full reference, whatever else the part says about it.
            metadata: JSON metadata.
            key: Identifies the write among this execution's writes (give one when writes run concurrently).

        Raises:
            LostClaim: The execution is no longer open, or its turn ended; nothing was written.
            ValueError: Another conversation, another role, or a part type a tool may not write.
            InputError: The text, metadata or key is not valid input.
            RecordNotFound: ``"media not found: <id>"``: a media part names an item this call may not use.
        """
        if conversation_id is not None and conversation_id != self.conversation_id:
            raise ValueError(
                f"a tool appends only to its own conversation ({self.conversation_id}); use deliver() for another"
            )
        if role != "user":
            raise ValueError(f"a tool appends user messages only, not {role!r}")
        if (text is None) == (content is None):
            raise ValueError("give text or content")
        parts: list[dict[str, Any]] | None = None
        if content is not None:
            parts = [dict(part) for part in content]
            check_json("content", parts)
            wrong = sorted({str(p.get("type")) for p in parts} - _TOOL_PART_TYPES)
            if wrong:
                raise ValueError(f"a tool may write text and media parts only, not {', '.join(wrong)}")
        else:
            check_text("text", text)
        check_json("metadata", dict(metadata) if metadata is not None else None)
        message_id = self._message_id(key)
        async with _worker_store(self).atomic(turn_id=self.root_turn_id) as tx:
            await fence_execution(tx, self.execution_id)
            if parts is not None:
                parts = await self._media_parts(tx, parts)
            return await tx.append_message(
                self.conversation_id,
                id=message_id,
                role="user",
                text=text,
                content=parts,
                metadata={**(metadata or {}), "tool_execution_id": self.execution_id},
            )

    async def say(
        self, text: str, *, metadata: Mapping[str, Any] | None = None, key: str | None = None
    ) -> MessageRecord:
        """Append a user message with ``text`` to the call's conversation (:meth:`append_message`)."""
        return await self.append_message(text=text, metadata=metadata, key=key)

    async def deliver(self, destination: str, text: str, *, key: str) -> DeliveryRecord:
        """Send ``text`` to a conversation as durable next-turn input (a delivery, behaviour §5.11), fenced by the
        call; its own conversation is a valid destination.

        The hook is asked ``send_message`` for the turn's principal first. The delivery's key is
        ``tool:<execution id>:<key>``: the same ``key`` on a retried attempt finds the same delivery.

        Raises:
            LostClaim: The execution is no longer open, or its turn ended; nothing was written.
            AuthorizationError: ``"not authorized to send_message"`` (the call fails as a denied one).
            RecordNotFound: ``"destination conversation not found: <id>"``.
            InputError: The destination, text or key is not valid input.
        """
        check_id("destination", destination, "conv")
        check_text("text", text)
        check_key("key", key)
        verdict = await check(
            "send_message",
            self.principal,
            source_conversation=self.conversation_id,
            destination_conversation=destination,
        )
        verdict.raise_if_denied()
        async with _worker_store(self).atomic(turn_id=self.root_turn_id) as tx:
            await fence_execution(tx, self.execution_id)
            delivery = await create_delivery(
                tx,
                source_conversation_id=self.conversation_id,
                destination_conversation_id=destination,
                key=f"tool:{self.execution_id}:{key}",
                text=text,
                source_turn_id=self.turn_id,
            )
        if self._signal is not None:
            await self._signal(delivery)
        return delivery

    async def put_media(self, data: bytes, *, mime_type: str, filename: str | None = None) -> MediaRecord:
        """Store media bytes (content-addressed: equal bytes have one id), fenced by the call; reference the returned
        item in a message's ``media`` part.

        Raises:
            LostClaim: The execution is no longer open, or its turn ended; nothing was written.
        """
        async with _worker_store(self).atomic(turn_id=self.root_turn_id) as tx:
            await fence_execution(tx, self.execution_id)
            record = await tx.put_media(bytes(data), mime_type=mime_type, filename=filename)
        self._put.add(record.id)
        return record

    async def _media_parts(self, tx: StoreTx, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``parts`` with each ``media`` part checked and completed from its record.

        A message's media part is what makes an item usable by its tree (:mod:`turnkit._engine.media_access`): a
        tool that wrote any id it was given (a model's argument, say) would open another tree's media to this one.
        """
        turn: TurnRecord | None = None
        checked: list[dict[str, Any]] = []
        for part in parts:
            if part.get("type") != "media":
                checked.append(part)
                continue
            media_id = part.get("media_id")
            if not isinstance(media_id, str) or not media_id:
                raise ValueError("a media part needs the media_id of a stored item (put_media)")
            if media_id in self._put:
                record = await tx.load_media(media_id)
            else:
                turn = turn or await tx.load_turn(self.turn_id)
                record = await usable_media(tx, turn, media_id)
            checked.append({**part, **media_part(record)})
        return checked

    def _message_id(self, key: str | None) -> str:
        if key is None:
            self._writes += 1
            key = f"#{self._writes}"
        else:
            check_key("key", key)
        digest = hashlib.sha256("\x1f".join((self.execution_id, "message", key)).encode()).hexdigest()
        return f"msg_{digest[:24]}"


def unfenced(store: ToolStore) -> Store:
    """The worker's store behind ``store``, for TurnKit's own tools (paint, view_media) that fence every write they
    make themselves (:func:`execution_fence`). Never hand it to application code."""
    return _worker_store(store)


def _worker_store(store: ToolStore) -> Store:
    return _WORKER_STORES[store]
