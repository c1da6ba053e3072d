"""``bench.turn_activities`` runs a turn's model and tool activities as its workflow calls them, without Temporal."""

from __future__ import annotations

import argparse

import pytest
from temporalio.client import Client

from bench.peers import workload
from bench.turn_activities import TurnActivities, main
from turnkit.store import Store


async def test_a_turns_activities_leave_the_record_a_turn_leaves(store: Store) -> None:
    """A K = 2 turn driven by the bench: the turn completes with the workload's answer, its two tool executions
    completed, its transcript the user's question, each call, each result and the answer; and no block heartbeat (the
    attempt's start is noted as on a worker)."""
    activities = TurnActivities(store, await Client.connect("127.0.0.1:1", lazy=True))
    turn_id = await activities.turn(2)
    turn = await store.load_turn(turn_id)
    assert (turn.status, turn.output_text) == ("completed", workload.final_answer(2))
    assert turn.options.state.iterations == 3
    executions = await store.list_tool_executions(turn_id=turn_id)
    assert [e.status for e in executions] == ["completed", "completed"]
    messages = await store.list_messages(turn.conversation_id)
    assert [m.role for m in messages] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert activities.heartbeats == 0


async def test_main_prints_the_cpu_per_turn(capsys: pytest.CaptureFixture[str]) -> None:
    """A short run on SQLite prints the median CPU of a turn's activities and each round's."""
    await main(argparse.Namespace(k=1, turns=2, rounds=2, warmup=1, database_url=None))
    printed = capsys.readouterr().out
    assert "the activities of a K = 1 turn (sqlite):" in printed and "rounds " in printed
