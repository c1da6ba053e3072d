"""``bench.mcp_calls``: turns that call a stdio MCP server's tool, its connections kept (the default) or one per
listing and call (``keep_alive=0``)."""

from __future__ import annotations

from pathlib import Path

from bench.mcp_calls import agents, run_turns, time_calls
from turnkit.runtime import TurnKit


async def test_kept_connections_start_one_server_process_and_per_request_ones_start_one_each(
    tk: TurnKit, tmp_path: Path
) -> None:
    """Two turns of each agent at K = 2, alternated: the kept agent's server starts one process, for its first
    listing, and its turns start none after that; the other agent's turns start one per listing and per call (3)."""
    starts = tmp_path / "starts"
    taken = await run_turns(tk, agents(starts), 2, 2, starts)
    assert all(wall > 0 and cpu >= 0 for wall, cpu, _ in taken["kept"] + taken["each"])
    assert sum(started for _, _, started in taken["kept"]) == 1
    assert [started for _, _, started in taken["each"]] == [3, 3]


async def test_single_calls_are_timed_on_kept_connections_and_on_connections_of_their_own(tmp_path: Path) -> None:
    """Two calls of each kind, after one warm-up call each: the two kept servers start one process each, for their
    warm-up, and the server without ``keep_alive`` one per call (3); every call is timed."""
    starts = tmp_path / "starts"
    taken = await time_calls(2, starts)
    assert {kind: len(times) for kind, times in taken.items()} == {
        "kept, at most once": 2,
        "kept, replay-safe": 2,
        "a connection each": 2,
    }
    assert all(time > 0 for times in taken.values() for time in times)
    assert len(starts.read_text().split()) == 2 + 3
