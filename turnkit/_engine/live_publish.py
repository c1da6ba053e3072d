"""The model activity's side of live streaming: a :class:`~turnkit.streaming.DeltaSink` that batches a model call's
deltas and publishes them on the store's live transport (:mod:`turnkit.store.live`).

A client writes deltas synchronously (``sink.text("...")``) from inside its streaming loop; they are merged while a
batch is in flight and sent by one background task, a batch per round trip, so a fast stream costs a NOTIFY
statement per :data:`BATCH_INTERVAL`, not one per token. Publishing is best effort: a failure is logged once and the
rest of the call's deltas are dropped (the committed response is unaffected). :meth:`CallPublisher.close` sends what
is left before the response is persisted, so a watcher receives the deltas before it can read the turn's end.

A retried attempt (``attempt > 1``) first publishes ``restart``, so watchers drop what earlier attempts streamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from turnkit.store.live import LiveKind, LiveMessage, Transport, chunked

__all__ = ["BATCH_INTERVAL", "CallPublisher"]

logger: Final = logging.getLogger("turnkit.live")

#: Seconds a batch waits for more deltas before it is sent (a round trip per batch, not per token).
BATCH_INTERVAL: Final = 0.02
#: Seconds :meth:`CallPublisher.close` waits for the last batches before dropping them.
CLOSE_TIMEOUT: Final = 5.0


class CallPublisher:
    """The deltas of one attempt of one model call, published in order (use as an async context manager)."""

    def __init__(
        self,
        transport: Transport,
        *,
        conversation_id: str,
        turn_id: str,
        call_id: str,
        attempt: int,
        root_turn_id: str = "",
    ) -> None:
        self.transport = transport
        self.root_turn_id = root_turn_id
        """A sub-agent's root turn (its tree channel carries the deltas too); "" for a root turn."""
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.call_id = call_id
        self.attempt = attempt
        self.published = 0
        """Messages sent so far (on PostgreSQL, only those to a conversation someone watches)."""
        self._pending: list[tuple[LiveKind, str]] = []
        self._seq = 0
        self._wake = asyncio.Event()
        self._closed = asyncio.Event()  # ends a batch's wait at once: the call's end is not delayed by it
        self._closing = False
        self._failed = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> CallPublisher:
        if self.attempt > 1:
            self._pending.append(("restart", ""))
            self._wake.set()
        self._task = asyncio.create_task(self._run(), name=f"turnkit-live-{self.call_id}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def text(self, delta: str) -> None:
        """Queue a piece of the answer's text."""
        self._add("text", delta)

    def thinking(self, delta: str) -> None:
        """Queue a piece of the thinking."""
        self._add("thinking", delta)

    def committed(self) -> None:
        """Queue ``committed``: the call's response is in the store (watchers read it now instead of at their next
        poll)."""
        self._add("committed", "", force=True)

    def _add(self, kind: LiveKind, delta: str, *, force: bool = False) -> None:
        if self._failed or (not delta and not force):
            return
        if self._pending and self._pending[-1][0] == kind and kind in ("text", "thinking"):
            self._pending[-1] = (kind, self._pending[-1][1] + delta)  # merged while the last batch is in flight
        else:
            self._pending.append((kind, delta))
        self._wake.set()

    async def close(self) -> None:
        """Send what is queued (within :data:`CLOSE_TIMEOUT` seconds) and stop."""
        self._closing = True
        self._closed.set()
        self._wake.set()
        task, self._task = self._task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(task, CLOSE_TIMEOUT)
        except TimeoutError:
            logger.warning("live deltas of model call %s dropped: the transport did not take them", self.call_id)

    async def flush(self) -> None:
        """Send what is queued now (the ``committed`` message after the response's write)."""
        await self._send()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._closing:  # let the deltas of the next few tokens join this batch
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._closed.wait(), BATCH_INTERVAL)
            await self._send()
            if self._closing and not self._pending:
                return

    async def _send(self) -> None:
        batch, self._pending = self._pending, []
        if not batch or self._failed:
            return
        messages: list[LiveMessage] = []
        for kind, delta in batch:
            base = LiveMessage(kind, self.conversation_id, self.turn_id, self.call_id, self.attempt, text=delta)
            for piece in chunked(base):
                messages.append(LiveMessage(piece.kind, *_ids(piece), self._seq, piece.text, self.root_turn_id))
                self._seq += 1
        try:
            self.published += await self.transport.publish(messages)
        except Exception as err:  # best effort: the committed response is what counts
            self._failed = True
            logger.warning("live deltas of model call %s not published (%s): the rest are dropped", self.call_id, err)


def _ids(message: LiveMessage) -> tuple[str, str, str, int]:
    return message.conversation_id, message.turn_id, message.call_id, message.attempt
