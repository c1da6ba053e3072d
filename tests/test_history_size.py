"""Payloads carry ids, not transcripts: a turn's history grows by a constant per iteration."""

from __future__ import annotations

from typing import Any

import turnkit
from turnkit.runtime import TurnKit
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool(recovery="replay_safe")
def fetch_page(n: int) -> dict[str, Any]:
    """Return a large page: its text goes to the store, never into the workflow history.

    Args:
        n: Page number.
    """
    return {"page": n, "text": "lorem ipsum " * 2000}


def iterations_agent(k: int) -> turnkit.Agent:
    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        done = sum(1 for m in request.messages if m["role"] == "tool")
        if done >= k - 1:
            return turnkit.Result.build(text="finished " + "x" * 5000)
        return call_tools(("fetch_page", {"n": done}), text="reading " + "y" * 2000)

    # No compaction: ~6,000 tokens of page text per iteration would trigger it near K=14, and this script counts
    # the tool results it sees (a summary replaces them).
    return turnkit.Agent(
        f"pager{k}",
        model="scripted",
        tools=[fetch_page],
        client=ScriptedClient(script),
        max_iterations=50,
        compaction=False,
    )


async def history_bytes(tk: TurnKit, k: int) -> int:
    conversation = await tk.conversation(iterations_agent(k))
    turn = await conversation.ask("read the pages")
    assert turn.status == "completed", turn.error
    assert turn.record.options.state.iterations == k
    history = await tk.client.get_workflow_handle(turn.id).fetch_history()
    return sum(event.ByteSize() for event in history.events)


async def test_history_grows_by_a_small_constant_per_iteration(tk: TurnKit) -> None:
    sizes = {k: await history_bytes(tk, k) for k in (2, 10, 20)}
    early = (sizes[10] - sizes[2]) / 8
    late = (sizes[20] - sizes[10]) / 10
    assert late <= 1.2 * early, sizes
    assert late < 3 * 1024, sizes  # ~10 KB of page text and model output per iteration stays out of the history
