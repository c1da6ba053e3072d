"""The tree of a run, read from the store: root turns, their sub-agent turns, tool executions and deliveries.

What ``turnkit show`` prints and ``turnkit show --html`` draws. A sub-agent turn hangs under the tool execution
that started it (``parent_tool_execution_id``) when the store knows it, else under its parent turn.
"""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.records import DeliveryRecord, MessageRecord, ToolExecutionRecord, TurnRecord
from turnkit.model import Usage
from turnkit.store.store import Store, utcnow

__all__ = ["TurnNode", "load_messages", "load_trees", "resolve_roots", "seconds_between", "subtree_ids"]


@dataclass
class TurnNode:
    """One turn with its tool executions, the deliveries it sent and its sub-agent turns (``children``)."""

    turn: TurnRecord
    executions: list[ToolExecutionRecord] = field(default_factory=list)
    deliveries: list[DeliveryRecord] = field(default_factory=list)
    children: list[TurnNode] = field(default_factory=list)

    @property
    def iterations(self) -> int:
        """Model iterations the turn has entered."""
        return self.turn.options.state.iterations

    @property
    def tokens(self) -> int:
        """Tokens the turn's model calls used (all buckets)."""
        return Usage.from_dict(self.turn.usage).total_tokens

    @property
    def duration(self) -> float | None:
        """Seconds from start to end (to now while it runs); None before it started."""
        return seconds_between(self.turn.started_at, self.turn.completed_at)

    def walk(self) -> list[TurnNode]:
        """This node and every node below it, depth first."""
        found: list[TurnNode] = [self]
        for child in self.children:
            found.extend(child.walk())
        return found

    def children_of(self, execution_id: str) -> list[TurnNode]:
        """The sub-agent turns the tool execution ``execution_id`` started."""
        return [child for child in self.children if child.turn.parent_tool_execution_id == execution_id]

    def to_dict(self, *, links: dict[str, str] | None = None) -> dict[str, Any]:
        """A JSON-ready view (``links``: workflow id -> Temporal UI address)."""
        turn = self.turn
        return {
            "turn_id": turn.id,
            "conversation_id": turn.conversation_id,
            "agent": turn.agent_name,
            "status": turn.status,
            "parent_turn_id": turn.parent_turn_id,
            "parent_tool_execution_id": turn.parent_tool_execution_id,
            "root_turn_id": turn.root_turn_id,
            "model": turn.model,
            "created_at": _iso(turn.created_at),
            "started_at": _iso(turn.started_at),
            "completed_at": _iso(turn.completed_at),
            "duration_seconds": self.duration,
            "iterations": self.iterations,
            "tokens": self.tokens,
            "usage": {k: v for k, v in turn.usage.items() if k != "cost_details"},
            "cost": turn.cost,
            "error": turn.error,
            "workflow_id": turn.id,
            "ui_url": (links or {}).get(turn.id),
            "tool_executions": [
                {
                    "id": e.id,
                    "tool_call_id": e.tool_call_id,
                    "tool_name": e.tool_name,
                    "status": e.status,
                    "started_at": _iso(e.started_at),
                    "completed_at": _iso(e.completed_at),
                    "duration_seconds": seconds_between(e.started_at, e.completed_at),
                    "error": e.error,
                }
                for e in self.executions
            ],
            "deliveries": [
                {
                    "id": d.id,
                    "key": d.key,
                    "destination_conversation_id": d.destination_conversation_id,
                    "delivered_at": _iso(d.delivered_at),
                }
                for d in self.deliveries
            ],
            "children": [child.to_dict(links=links) for child in self.children],
        }


def seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    """``end - start`` in seconds (``end`` defaults to now); None without a start."""
    if start is None:
        return None
    return round(((end or utcnow()) - start).total_seconds(), 3)


async def resolve_roots(store: Store, ident: str) -> list[str]:
    """The root turn ids ``ident`` names: a turn id (its tree's root) or a conversation id (the roots of its turns).

    Raises:
        RecordNotFound: no such turn or conversation, or a conversation without turns.
    """
    if ident.startswith("conv_"):
        await store.load_conversation(ident)  # RecordNotFound when absent
        turns = await store.list_turns(conversation_id=ident)
        if not turns:
            raise RecordNotFound(f"conversation {ident} has no turns yet")
        return list(dict.fromkeys(turn.root_turn_id for turn in turns))
    return [(await store.load_turn(ident)).root_turn_id]


async def load_trees(store: Store, ident: str) -> list[TurnNode]:
    """The trees ``ident`` (a turn or conversation id) belongs to, one per root turn, oldest first."""
    return [await _load_tree(store, root) for root in await resolve_roots(store, ident)]


async def load_messages(store: Store, trees: list[TurnNode]) -> dict[str, list[MessageRecord]]:
    """Turn id -> the turn's messages in sequence order, for every turn of ``trees``: the user message that asked for
    it first (it is written before the turn, so it may not name it), then what the turn wrote."""
    found: dict[str, list[MessageRecord]] = {}
    for node in (node for tree in trees for node in tree.walk()):
        turn = node.turn
        messages = await store.list_messages(turn.conversation_id, turn_id=turn.id)
        trigger = turn.options.trigger_message_id
        if trigger and all(message.id != trigger for message in messages):
            # A trigger pruned from the store is left out: the turn's own messages still tell its story.
            async with store.atomic() as tx:
                with suppress(RecordNotFound):
                    messages.insert(0, await tx.load_message(str(trigger)))
        found[turn.id] = messages
    return found


def subtree_ids(root: TurnNode, turn_id: str) -> list[str]:
    """The ids of ``turn_id`` and every turn below it in ``root``'s tree ([] when it is not in the tree)."""
    for node in root.walk():
        if node.turn.id == turn_id:
            return [each.turn.id for each in node.walk()]
    return []


async def _load_tree(store: Store, root_turn_id: str) -> TurnNode:
    turns = await store.list_turns(root_turn_id=root_turn_id)
    executions = await store.list_tool_executions(root_turn_id=root_turn_id)
    nodes = {turn.id: TurnNode(turn) for turn in turns}
    for execution in executions:
        if execution.turn_id in nodes:
            nodes[execution.turn_id].executions.append(execution)
    async with store.atomic() as tx:
        for conversation_id in dict.fromkeys(turn.conversation_id for turn in turns):
            for delivery in await tx.list_deliveries(source_conversation_id=conversation_id):
                if delivery.source_turn_id in nodes:
                    nodes[delivery.source_turn_id].deliveries.append(delivery)
    for turn in turns:
        if turn.parent_turn_id in nodes and turn.id != root_turn_id:
            nodes[turn.parent_turn_id].children.append(nodes[turn.id])
    if root_turn_id not in nodes:
        raise RecordNotFound(f"turn {root_turn_id} not found")
    return nodes[root_turn_id]


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
