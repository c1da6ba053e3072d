"""Lifecycle events (behaviour §3.11), delivered to ``settings.on_event`` after the corresponding store write committed.

A write's events are registered inside its transaction with :func:`announce` (or :func:`announce_message`) and sent
by :meth:`~turnkit.store.store.Store.atomic` once it committed: a rolled-back write announces nothing, and an attempt
that finds the write already committed (a retry) writes nothing and so announces nothing again. Events with no write
behind them (``turn.started`` after the claim, ``model.requested``) are sent with :func:`emit` directly.

Events are observations, not durable records: a worker that dies between a commit and its callbacks loses those
events, and the retried attempt does not repeat them. Each callback (sync, or ``async def``) is awaited in turn, so one
emitter's events arrive in order; a sync callback runs in a thread (:mod:`turnkit.callbacks`), never on the
worker's event loop. A callback that raises is logged and ignored: the write it reports has committed, so failing
(and retrying) the activity would only repeat work (this differs from the gem, where the exception propagates).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from turnkit.callbacks import call_application, require_no_transaction
from turnkit.config import settings
from turnkit.records import MessageRecord
from turnkit.store.store import StoreTx, utcnow

__all__ = ["Event", "announce", "announce_message", "emit", "logger"]

logger: Final = logging.getLogger("turnkit.events")


@dataclass(frozen=True)
class Event:
    """One lifecycle event: ``type`` such as ``model.completed``, the turn's ids, and a small payload."""

    type: str
    turn_id: str
    conversation_id: str
    payload: dict[str, Any] = field(default_factory=dict[str, Any])
    created_at: datetime = field(default_factory=utcnow)


async def emit(type: str, turn_id: str, conversation_id: str, **payload: Any) -> None:
    """Send an event to the configured ``on_event`` callback (or callbacks), if any; call it after the commit."""
    callback = settings.on_event
    if callback is None:
        return
    require_no_transaction()
    event = Event(type=type, turn_id=turn_id, conversation_id=conversation_id, payload=payload)
    callbacks = callback if isinstance(callback, list | tuple) else [callback]
    for each in callbacks:
        try:
            await call_application(each, event)
        except Exception as err:
            logger.warning("an on_event callback raised on %s for turn %s; ignored", type, turn_id, exc_info=err)


def announce(tx: StoreTx, type: str, turn_id: str, conversation_id: str, **payload: Any) -> None:
    """Send an event once ``tx`` has committed (never if it rolls back); see the module docstring."""
    if settings.on_event is None:
        return

    async def send() -> None:
        await emit(type, turn_id, conversation_id, **payload)

    tx.after_commit(send)


def announce_message(tx: StoreTx, message: MessageRecord) -> None:
    """``message.created {message_id, role, kind}`` for a turn's message just written in ``tx`` (behaviour §3.7)."""
    if message.turn_id is not None:
        announce(
            tx,
            "message.created",
            message.turn_id,
            message.conversation_id,
            message_id=message.id,
            role=message.role,
            kind=message.kind,
        )
