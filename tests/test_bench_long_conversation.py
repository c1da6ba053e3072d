"""``bench.long_conversation``'s side-by-side comparison: the long conversation's turns alternated with fresh
conversations' turns 10-60 (issue 37 target 4)."""

from __future__ import annotations

from collections import Counter

from bench.long_conversation import AGENT, EARLY, alternate
from turnkit.runtime import TurnKit


async def test_alternated_turns_pair_the_long_conversation_with_a_fresh_one_at_its_turns_10_to_60(tk: TurnKit) -> None:
    """Three pairs: three more turns of the long conversation, and one fresh conversation warmed with its first ten
    turns, then asked three times, each turn timed once, in wall time and in CPU."""
    long = await tk.conversation(AGENT)
    first = (await long.ask("go")).record
    taken = await alternate(tk, long, 3)
    assert len(taken.late) == len(taken.early) == 3
    assert all(wall > 0 and cpu >= 0 for wall, cpu in taken.late + taken.early)
    since = [t for t in await tk.store.list_turns(agent_name=AGENT.name) if t.created_at >= first.created_at]
    assert all(t.status == "completed" for t in since)
    per_conversation = Counter(t.conversation_id for t in since)
    assert per_conversation.pop(long.id) == 1 + 3
    assert list(per_conversation.values()) == [EARLY[0] + 3]
