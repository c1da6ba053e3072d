"""``turnkit events TURN_ID|CONVERSATION_ID [--follow]``: a turn's (or a conversation's) events, from the store.

Lifecycle events (:mod:`turnkit.events`) go to in-process callbacks and are not stored, so another process cannot
subscribe to them. The store records everything they report, though: this module turns a turn's records (and those
of the sub-agent turns below it) into a time-ordered stream of the same kinds of events: ``turn.created``,
``turn.started``, ``message.<role>``, ``tool_call.created``, ``tool_call.started``, ``tool_call.<status>``,
``delivery.created`` and ``turn.<terminal status>``. ``follow`` polls and yields each new event once, until the
turn is terminal. Summaries and agent names are :func:`~turnkit._ops.printable.printable`: no terminal escape
sequence from the record reaches the operator's terminal.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from turnkit._engine.ids import PREFIXES
from turnkit._ops.printable import printable
from turnkit._ops.tree import TurnNode, load_trees
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.records import TERMINAL_TOOL_EXECUTION_STATUSES, TERMINAL_TURN_STATUSES
from turnkit.store.store import Store

__all__ = ["StreamEvent", "follow", "turn_events"]

#: Tie-breaks between events recorded in the same instant: a thing is created before it starts, starts before it ends.
_ORDER = {"created": 0, "started": 1}


@dataclass(frozen=True)
class StreamEvent:
    """One event of the stream: when, what, which turn, a short summary; ``key`` identifies it across polls."""

    at: datetime
    type: str
    turn_id: str
    agent: str
    summary: str
    key: str

    def line(self) -> str:
        """The event as one line of text."""
        at = self.at.isoformat(timespec="milliseconds")
        return f"{at}  {self.turn_id}  {self.agent:<14} {self.type:<20} {self.summary}"

    def to_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data."""
        return {
            "at": self.at.isoformat(),
            "type": self.type,
            "turn_id": self.turn_id,
            "agent": self.agent,
            "summary": self.summary,
        }


async def turn_events(store: Store, ident: str) -> tuple[list[StreamEvent], bool]:
    """The events recorded so far, oldest first, and whether it is all over: for a turn id, the turn's and those of
    the sub-agent turns below it (over once the turn is terminal); for a conversation id, those of every turn of the
    conversation, each with its sub-agents (over once every one of them is terminal).

    Raises:
        ValueError: ``ident`` is neither a turn id (``turn_…``) nor a conversation id (``conv_…``).
        RecordNotFound: no such turn or conversation, or a conversation without turns.
    """
    nodes = await _nodes_of(store, ident)
    events: list[StreamEvent] = []
    for node in nodes:
        for each in node.walk():
            events.extend(await _node_events(store, each))
    events.sort(key=lambda e: (e.at, _ORDER.get(e.type.split(".")[-1], 5), e.key))
    return events, all(node.turn.status in TERMINAL_TURN_STATUSES for node in nodes)


async def follow(store: Store, ident: str, *, interval: float = 0.5) -> AsyncIterator[StreamEvent]:
    """Every event of the turn or conversation once, as it is recorded, polling every ``interval`` seconds; ends once
    it is all over (see :func:`turn_events`), after the last events."""
    seen: set[str] = set()
    while True:
        events, done = await turn_events(store, ident)
        for event in events:
            if event.key not in seen:
                seen.add(event.key)
                yield event
        if done:
            return
        await asyncio.sleep(interval)


async def _nodes_of(store: Store, ident: str) -> list[TurnNode]:
    """The turn ``ident`` names (with its sub-agents), or every root turn of the conversation it names."""
    if not ident.startswith((f"{PREFIXES['turn']}_", f"{PREFIXES['conversation']}_")):
        raise ValueError(f"not a turn id (turn_…) or a conversation id (conv_…): {ident!r}")
    trees = await load_trees(store, ident)
    if ident.startswith(f"{PREFIXES['conversation']}_"):
        # A sub-agent's conversation: its turns hang in their parents' trees; only its own turns are its events.
        own = [n for tree in trees for n in tree.walk() if n.turn.conversation_id == ident]
        return [n for n in own if n.turn.parent_turn_id is None or all(p.turn.id != n.turn.parent_turn_id for p in own)]
    return [next(n for tree in trees for n in tree.walk() if n.turn.id == ident)]


async def _node_events(store: Store, node: TurnNode) -> list[StreamEvent]:
    turn = node.turn
    agent = printable(turn.agent_name, one_line=True)

    def event(at: datetime | None, type: str, summary: str, key: str) -> list[StreamEvent]:
        # The record's text (and an agent's name) is printed on a terminal: no escape sequence in it may reach it.
        safe = printable(summary, one_line=True)
        return [] if at is None else [StreamEvent(at, type, turn.id, agent, safe, f"{turn.id}:{key}")]

    found: list[StreamEvent] = []
    parent = f"sub-agent of {turn.parent_turn_id}" if turn.parent_turn_id else f"in {turn.conversation_id}"
    found += event(turn.created_at, "turn.created", parent, "created")
    found += event(turn.started_at, "turn.started", f"model {turn.model or '-'}", "started")
    messages = await store.list_messages(turn.conversation_id, turn_id=turn.id)
    trigger = turn.options.trigger_message_id
    if trigger and all(message.id != trigger for message in messages):
        async with store.atomic() as tx:
            with suppress(RecordNotFound):
                messages.insert(0, await tx.load_message(str(trigger)))  # the user message that asked for the turn
    for message in messages:
        found += event(
            message.created_at,
            f"message.{message.role}",
            _message_summary(message.kind, message.content),
            f"message:{message.id}",
        )
    for execution in node.executions:
        args = _short(json.dumps(execution.arguments, default=str), 60)
        found += event(
            execution.created_at, "tool_call.created", f"{execution.tool_name} {args}", f"tool:{execution.id}:created"
        )
        started = max(execution.started_at, execution.created_at) if execution.started_at else None
        found += event(started, "tool_call.started", execution.tool_name, f"tool:{execution.id}:started")
        if execution.status in TERMINAL_TOOL_EXECUTION_STATUSES:
            detail = _short(json.dumps(execution.error or execution.result, default=str), 80)
            found += event(
                execution.completed_at or execution.updated_at,
                f"tool_call.{execution.status}",
                f"{execution.tool_name} {detail}",
                f"tool:{execution.id}:{execution.status}",
            )
    for delivery in node.deliveries:
        found += event(
            delivery.created_at,
            "delivery.created",
            f"to {delivery.destination_conversation_id}",
            f"delivery:{delivery.id}",
        )
    if turn.status in TERMINAL_TURN_STATUSES or turn.status == "stale":
        summary = turn.output_text or (f"{turn.error.get('class')}: {turn.error.get('message')}" if turn.error else "")
        found += event(turn.completed_at or turn.updated_at, f"turn.{turn.status}", _short(summary, 80), "end")
    return found


def _message_summary(kind: str, content: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    for part in content:
        if part.get("type") == "tool_call":
            parts.append(f"calls {part.get('name')}")
        elif part.get("type", "text") == "text":
            parts.append(str(part.get("text", "")))
    return f"[{kind}] " + _short(" · ".join(parts), 80)


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
