"""``Turn.stream()`` and ``Conversation.stream()``: a turn's live deltas merged with the events its records commit.

Live messages (:mod:`turnkit.store.live`) give the model's text and thinking as it streams and the restarts of
retried calls. The store gives the rest, read again every ``poll`` seconds and at once when a model call's response
was committed (its ``committed`` message): sub-agent turns created below the turn, tool calls started and finished,
turns ended. The stream subscribes before its first read, so nothing committed is missed, a turn that ended before
the stream began gives its :class:`~turnkit.streaming.TurnEnded` at once, and the turn's last deltas are received
before its end is yielded (:meth:`~turnkit.store.live.Subscription.barrier`). Without a live transport that reaches
this process (SQLite, the worker in another process) the stream has the committed events only.

Deltas of a call are kept in order per attempt (``seq``); a message of an older attempt than the newest seen is
dropped, and a newer attempt starts with one :class:`~turnkit.streaming.Restart` even if its own ``restart``
message was lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from turnkit.kernel.records import TERMINAL_TOOL_EXECUTION_STATUSES, TurnRecord
from turnkit.store.live import LiveMessage, Subscription, transport_for, tree_key
from turnkit.store.store import Store
from turnkit.streaming import (
    Restart,
    SubAgentStarted,
    TextDelta,
    ThinkingDelta,
    ToolCallFinished,
    ToolCallStarted,
    TurnEnded,
    TurnStreamEvent,
)

__all__ = ["POLL_INTERVAL", "LiveCalls", "stream_conversation", "stream_turn"]

#: Seconds between reads of the store while no ``committed`` message comes.
POLL_INTERVAL = 0.25


@dataclass
class LiveCalls:
    """What the live messages of the model calls said so far: the newest attempt and last ``seq`` of each call;
    :meth:`events` turns each new message into the stream's events."""

    attempts: dict[str, int] = field(default_factory=dict)
    last_seq: dict[tuple[str, int], int] = field(default_factory=dict)

    def events(self, message: LiveMessage) -> list[TurnStreamEvent]:
        """The events of ``message``: none for a repeated one or one of a superseded attempt; a ``Restart`` first
        when it is the first of a newer attempt."""
        call, attempt = message.call_id, message.attempt
        newest = self.attempts.get(call)
        if newest is not None and attempt < newest:
            return []  # an older attempt (a zombie still streaming): its text is void
        if (call, attempt) in self.last_seq and message.seq <= self.last_seq[call, attempt]:
            return []  # seen already
        self.last_seq[call, attempt] = message.seq
        found: list[TurnStreamEvent] = []
        if (newest is not None and attempt > newest) or (newest is None and message.kind == "restart"):
            found.append(Restart(message.turn_id, call, attempt))
        self.attempts[call] = attempt
        if message.kind == "text":
            found.append(TextDelta(message.turn_id, call, attempt, message.text))
        elif message.kind == "thinking":
            found.append(ThinkingDelta(message.turn_id, call, attempt, message.text))
        return found


@dataclass
class _Follower:
    """One turn followed: the committed events already yielded, and the turns of its tree."""

    store: Store
    turn_id: str
    seen: set[str] = field(default_factory=set)
    tree: set[str] = field(default_factory=set)
    conversations: set[str] = field(default_factory=set)

    async def read(self) -> tuple[list[TurnStreamEvent], TurnRecord]:
        """The committed events not yielded yet (the turn's own end left out), and the turn as it is now."""
        turn = await self.store.load_turn(self.turn_id)
        self.tree.add(turn.id)
        self.conversations.add(turn.conversation_id)
        found: list[TurnStreamEvent] = []
        turns = await self.store.list_turns(root_turn_id=turn.root_turn_id)
        by_parent: dict[str, list[TurnRecord]] = {}
        for each in turns:
            if each.parent_turn_id is not None:
                by_parent.setdefault(each.parent_turn_id, []).append(each)
        below = list(by_parent.get(turn.id, ()))
        while below:  # the sub-agent turns below this one, parents first
            child = below.pop(0)
            self.tree.add(child.id)
            self.conversations.add(child.conversation_id)
            assert child.parent_turn_id is not None
            if self._first(f"sub:{child.id}"):
                found.append(SubAgentStarted(child.id, child.parent_turn_id, child.agent_name, child.conversation_id))
            if child.terminal and self._first(f"end:{child.id}"):
                found.append(_ended(child))
            below.extend(by_parent.get(child.id, ()))
        executions = await self.store.list_tool_executions(root_turn_id=turn.root_turn_id)
        for execution in executions:
            if execution.turn_id not in self.tree:
                continue
            key = f"{execution.turn_id}:{execution.tool_call_id}"
            finished = execution.status in TERMINAL_TOOL_EXECUTION_STATUSES
            if (execution.started_at is not None or finished) and self._first(f"start:{key}"):
                found.append(
                    ToolCallStarted(execution.turn_id, execution.tool_call_id, execution.tool_name, execution.arguments)
                )
            if finished and self._first(f"done:{key}"):
                found.append(
                    ToolCallFinished(
                        execution.turn_id,
                        execution.tool_call_id,
                        execution.tool_name,
                        execution.status,
                        execution.result,
                        execution.error,
                    )
                )
        return found, turn

    def _first(self, key: str) -> bool:
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _ended(turn: TurnRecord) -> TurnEnded:
    return TurnEnded(turn.id, turn.status, turn.output_text or "", turn.error)


async def _follow(
    follower: _Follower, subscription: Subscription, calls: LiveCalls, poll: float
) -> AsyncIterator[TurnStreamEvent]:
    """The events of ``follower``'s turn until it ended (its :class:`TurnEnded` last).

    A model call's first live message sends the stream back to the store before its deltas are yielded: a call
    starts only once the step before it committed, so the tool calls it follows are yielded before its text.
    """
    read_before: set[str] = set()  # the calls whose first message was preceded by a read of the store
    while True:
        events, turn = await follower.read()
        await subscription.add(follower.conversations)  # sub-agents' conversations: their deltas too
        for event in events:
            yield event
        if turn.terminal:
            # Every delta published before the end was committed is queued once the barrier returns.
            await subscription.barrier(turn.conversation_id)
            later: list[LiveMessage] = []  # the conversation's next turn may have begun: its messages stay queued
            while (message := await subscription.get(timeout=0)) is not None:
                if message.turn_id not in follower.tree and message.kind != "committed":
                    later.append(message)
                for event in _live(message, follower, calls):
                    yield event
            subscription.put_back(later)
            yield _ended(turn)
            return
        message = await subscription.get(timeout=poll)
        while message is not None and message.kind != "committed":
            if message.call_id not in read_before:  # a new call (perhaps of a sub-agent the store shows now)
                read_before.add(message.call_id)
                subscription.put_back([message])  # read the store first, then this message
                break
            for event in _live(message, follower, calls):
                yield event
            message = await subscription.get(timeout=0)


def _live(message: LiveMessage, follower: _Follower, calls: LiveCalls) -> list[TurnStreamEvent]:
    if message.turn_id not in follower.tree:
        return []  # another turn of a conversation followed (an earlier one's late message)
    return calls.events(message)


async def stream_turn(store: Store, turn_id: str, *, poll: float = POLL_INTERVAL) -> AsyncIterator[TurnStreamEvent]:
    """The events of ``turn_id`` and the sub-agent turns below it, live and committed, until the turn ends."""
    turn = await store.load_turn(turn_id)
    # A root turn's sub-agents publish on its tree channel too: their first words arrive before the store shows them.
    keys = [turn.conversation_id, *([tree_key(turn.id)] if turn.parent_turn_id is None else [])]
    subscription = await transport_for(store).subscribe(keys)
    try:
        async for event in _follow(_Follower(store, turn_id), subscription, LiveCalls(), poll):
            yield event
    finally:
        await subscription.close()


async def stream_conversation(
    store: Store, conversation_id: str, *, poll: float = POLL_INTERVAL
) -> AsyncIterator[TurnStreamEvent]:
    """The events of the conversation's turns, one turn after the other (they run one at a time): the unfinished
    ones, then every turn that starts later. Runs until the caller stops iterating."""
    subscription = await transport_for(store).subscribe([conversation_id])
    calls = LiveCalls()
    done: set[str] = {t.id for t in await store.list_turns(conversation_id=conversation_id) if t.terminal}
    try:
        while True:
            turns = await store.list_turns(conversation_id=conversation_id)
            following = next((t for t in turns if t.id not in done), None)
            if following is None:
                # Idle: a new turn's first live message (left queued for its stream) or the next poll, whichever first.
                if await subscription.wait(timeout=poll):
                    message = await subscription.get(timeout=0)
                    delta = message is not None and message.kind in ("text", "thinking", "restart")
                    if message is not None and delta and message.turn_id not in done:
                        subscription.put_back([message])
                        await asyncio.sleep(0)  # the turn's record was committed before its model call began
                continue
            if following.parent_turn_id is None:
                await subscription.add([tree_key(following.id)])  # its sub-agents' deltas
            async for event in _follow(_Follower(store, following.id), subscription, calls, poll):
                yield event
            done.add(following.id)
    finally:
        await subscription.close()
