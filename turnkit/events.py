"""Lifecycle events (spec §3.11), delivered synchronously to ``settings.on_event``.

Events are observations, not durable records: they are emitted by activities after the corresponding store write
committed. An exception raised by a callback propagates into the activity, as in the gem (a worker "crash").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from turnkit.config import settings
from turnkit.store.store import utcnow

__all__ = ["Event", "emit"]


@dataclass(frozen=True)
class Event:
    """One lifecycle event: ``type`` such as ``model.completed``, the turn's ids, and a small payload."""

    type: str
    turn_id: str
    conversation_id: str
    payload: dict[str, Any] = field(default_factory=dict[str, Any])
    created_at: datetime = field(default_factory=utcnow)


def emit(type: str, turn_id: str, conversation_id: str, **payload: Any) -> None:
    """Send an event to the configured ``on_event`` callback (or callbacks), if any."""
    callback = settings.on_event
    if callback is None:
        return
    event = Event(type=type, turn_id=turn_id, conversation_id=conversation_id, payload=payload)
    callbacks = callback if isinstance(callback, list | tuple) else [callback]
    for each in callbacks:
        each(event)
