"""``bench.next_turn``'s side-by-side comparison: fresh conversations' first turns alternated with idle
conversations' next turns (issue 37 target 3)."""

from __future__ import annotations

from collections import Counter

from bench.next_turn import LAG, alternate
from bench.peers.turnkit_app import AGENT
from turnkit.runtime import TurnKit
from turnkit.store.store import utcnow


async def test_alternated_pairs_ask_each_conversation_twice_its_first_and_then_its_next_turn(tk: TurnKit) -> None:
    """Three pairs at K = 1: ``LAG`` + 3 conversations, the first ``LAG`` asked before the pairs; each pair asks a new
    one its first turn and the oldest idle one its second, each turn timed once: wall time, this process's CPU and
    the session's dev server's (a child of this process), which the six turns kept busy for at least one clock tick.
    No conversation has more than two turns, and every turn completed."""
    since = utcnow()
    taken = await alternate(tk, 1, 3, server=True)
    assert len(taken.first) == len(taken.next) == 3
    assert all(wall > 0 and cpu >= 0 and server >= 0 for wall, cpu, server in taken.first + taken.next)
    assert sum(server for _, _, server in taken.first + taken.next) > 0
    turns = [t for t in await tk.store.list_turns(agent_name=AGENT.name) if t.created_at >= since]
    assert {t.status for t in turns} == {"completed"}
    per_conversation = Counter(t.conversation_id for t in turns)
    assert len(per_conversation) == LAG + 3
    assert sorted(per_conversation.values()) == [1] * LAG + [2] * 3  # the last LAG asked once; 3 asked again
