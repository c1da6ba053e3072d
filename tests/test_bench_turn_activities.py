"""``bench.turn_activities`` runs a turn's model and tool activities as its workflow calls them, without Temporal."""

from __future__ import annotations

import argparse
import gc
import importlib
import inspect

import pytest
from temporalio.client import Client

from bench.activity_breakdown import TIMED, Timings, breakdown, timing
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


async def test_the_breakdown_times_each_phase_per_call_and_puts_everything_back(store: Store) -> None:
    """``bench.activity_breakdown`` on a K = 2 turn: each model phase timed 3 times a turn and each tool phase twice,
    the collector's passes on a line of their own; afterwards every timed function is the original again and the
    collector's frozen heap is as it was."""
    before = [_resolve(module, path) for module, path in TIMED]
    frozen = gc.get_freeze_count()
    lines = await breakdown(store, k=2, turns=2, warmup=1)
    rows = {line.split()[-1]: line.split() for line in lines[1:-2]}
    assert rows["ModelActivities._reserve"][0] == "3.0" and rows["ModelActivities._write_response"][0] == "3.0"
    assert rows["ToolActivities._reserve"][0] == "2.0" and rows["ToolActivities._complete"][0] == "2.0"
    assert "the garbage collector's passes" in lines[-2] and lines[-1].endswith("(its activities, this thread)")
    assert [_resolve(module, path) for module, path in TIMED] == before
    assert gc.get_freeze_count() == frozen


def test_a_timed_name_that_no_longer_exists_is_an_error() -> None:
    """A function renamed away from the breakdown's list fails the run instead of dropping out of the table."""
    with pytest.raises(AttributeError), timing(Timings(), (("turnkit.store.store", "StoreTx.no_such_call"),)):
        pass


def _resolve(module: str, path: str) -> object:
    owner: object = importlib.import_module(module)
    for part in path.split("."):
        owner = inspect.getattr_static(owner, part)
    return owner
