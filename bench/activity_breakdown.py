"""Where a turn's activities spend their CPU, call by call: ``python -m bench.activity_breakdown``.

:mod:`bench.turn_activities` runs the model and tool activities of K-iteration turns without Temporal. This script
runs the same turns with a CPU timer around each phase of those activities and each store call under them (the list
is :data:`TIMED`), and prints, for each, its calls per turn, its CPU per call and per turn, and its share of the
turn. The timer reads ``time.thread_time()``, the event loop thread's own CPU: SQLite's checkpoint thread and the
PostgreSQL server are not in it, the driver's protocol work on this thread is. A call that awaits would also count
what other tasks run meanwhile; the turns here run one at a time, and nothing else runs on the loop.

Times are inclusive (a phase contains the store calls under it), so the rows do not add up. Before the measured
turns, the warm-up's heap is frozen (``gc.freeze()``) and each collection of the garbage collector is timed apart:
a full collection takes ~100 ms and would be charged to whichever call allocated last, making a cheap call that
allocates (a turn's options written as JSON) look ten times as costly as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import importlib
import inspect
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client

from bench.turn_activities import TurnActivities
from turnkit.store import Store

#: What is timed: (module, attribute path) of each function, patched where the callers look it up. Methods of the
#: activities and of ``StoreTx`` are patched on their class; a function imported by name is patched in the module
#: that calls it.
TIMED: tuple[tuple[str, str], ...] = (
    ("turnkit._activities.model", "ModelActivities.model"),
    ("turnkit._activities.model", "ModelActivities._reserve"),
    ("turnkit._activities.model", "ModelActivities._persist"),
    ("turnkit._activities.model", "ModelActivities._write_response"),
    ("turnkit._activities.model", "build_model_request"),
    ("turnkit._activities.model", "append_charged"),
    ("turnkit._engine.transcripts", "Transcripts.read"),
    ("turnkit._activities.tools", "ToolActivities.run_tool"),
    ("turnkit._activities.tools", "ToolActivities._reserve"),
    ("turnkit._activities.tools", "ToolActivities._complete"),
    ("turnkit.testing", "ScriptedClient.chat"),
    ("turnkit.store.store", "StoreTx.find_turn"),
    ("turnkit.store.store", "StoreTx.claim_turn"),
    ("turnkit.store.store", "StoreTx.update_turn"),
    ("turnkit.store.store", "StoreTx.lock"),
    ("turnkit.store.store", "StoreTx.list_messages"),
    ("turnkit.store.store", "StoreTx.find_response"),
    ("turnkit.store.store", "StoreTx.latest_response"),
    ("turnkit.store.store", "StoreTx.append_message_and_update_turn"),
    ("turnkit.store.store", "StoreTx.create_tool_execution"),
    ("turnkit.store.store", "StoreTx.complete_tool_execution"),
    # A record's builder, in each module of the store's transaction that calls it (one line of the table each).
    ("turnkit.store.tx.turns", "turn_record"),
    ("turnkit.store.tx.messages", "turn_record"),
    ("turnkit.store.tx.turns", "turn_values"),
    ("turnkit.store.tx.messages", "turn_values"),
    ("turnkit.store.tx.messages", "message_record"),
    ("turnkit.store.tx.tool_executions", "message_record"),
    # SQLite's statements on the driver, its BEGIN IMMEDIATEs and its COMMITs (SQLAlchemy's, at a transaction's end).
    ("turnkit.store.sqlite_inline", "InlineConnection._run"),
    ("turnkit.store.sqlite_inline", "InlineSQLite._begin_immediate"),
    ("sqlalchemy.engine", "Transaction.commit"),
)


@dataclass
class Timings:
    """The CPU and calls of each timed function, and of the garbage collector's passes."""

    cpu: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    calls: Counter[str] = field(default_factory=Counter)
    collector: float = 0.0
    collections: int = 0

    def clear(self) -> None:
        """Forget what was timed so far (the warm-up's)."""
        self.cpu.clear()
        self.calls.clear()
        self.collector, self.collections = 0.0, 0


def _timed(function: Callable[..., Any], name: str, timings: Timings) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(function):

        @functools.wraps(function)
        async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return await function(*args, **kwargs)
            finally:
                timings.cpu[name] += time.thread_time() - started
                timings.calls[name] += 1

        return timed_coroutine

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return function(*args, **kwargs)
        finally:
            timings.cpu[name] += time.thread_time() - started
            timings.calls[name] += 1

    return timed


@contextlib.contextmanager
def timing(timings: Timings, timed: tuple[tuple[str, str], ...] = TIMED) -> Generator[None]:
    """Within the block, each function of ``timed`` adds its CPU and calls to ``timings`` and each garbage
    collection its time; everything is as it was after it. A name that no longer exists raises ``AttributeError``
    (the list is kept with the code it times)."""
    patched: list[tuple[Any, str, Any]] = []
    collecting = [0.0]

    def collector(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collecting[0] = time.thread_time()
        else:
            timings.collector += time.thread_time() - collecting[0]
            timings.collections += 1

    try:
        for module_name, path in timed:
            owner: Any = importlib.import_module(module_name)
            *parents, attribute = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            original = inspect.getattr_static(owner, attribute)
            patched.append((owner, attribute, original))
            setattr(owner, attribute, _timed(getattr(owner, attribute), path, timings))
        gc.callbacks.append(collector)
        yield
    finally:
        if collector in gc.callbacks:
            gc.callbacks.remove(collector)
        for owner, attribute, original in reversed(patched):
            setattr(owner, attribute, original)


def table(timings: Timings, turns: int, total: float) -> list[str]:
    """The lines of the breakdown: per timed function, most CPU first; then the collector's and the whole turn's."""
    lines = [f"{'calls/turn':>10} {'µs/call':>9} {'ms/turn':>8} {'share':>6}  function (inclusive)"]
    for name, cpu in sorted(timings.cpu.items(), key=lambda item: -item[1]):
        calls = timings.calls[name]
        lines.append(
            f"{calls / turns:10.1f} {cpu / calls * 1e6:9.1f} {cpu / turns * 1e3:8.2f} {cpu / total:6.1%}  {name}"
        )
    lines.append(
        f"{timings.collections / turns:10.1f} {'':9} {timings.collector / turns * 1e3:8.2f} "
        f"{timings.collector / total:6.1%}  the garbage collector's passes (the warm-up's heap frozen)"
    )
    lines.append(f"{'':10} {'':9} {total / turns * 1e3:8.2f} {1:6.0%}  the turn (its activities, this thread)")
    return lines


async def breakdown(store: Store, k: int, turns: int, warmup: int) -> list[str]:
    """Run ``warmup`` K-iteration turns, then ``turns`` more timed call by call: the table's lines."""
    activities = TurnActivities(store, await Client.connect("127.0.0.1:1", lazy=True))
    timings = Timings()
    frozen = gc.get_freeze_count()
    with timing(timings):
        for _ in range(warmup):
            await activities.turn(k)
        gc.collect()
        gc.freeze()
        try:
            timings.clear()
            started = time.thread_time()
            for _ in range(turns):
                await activities.turn(k)
            total = time.thread_time() - started
        finally:
            # Release what this froze; a heap the process froze itself before stays frozen (unfreeze would release
            # it too), with the warm-up's objects added to it.
            if frozen == 0:
                gc.unfreeze()
    return table(timings, turns, total)


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="turnkit-activity-breakdown-") as tmp:
        store = await Store.open(args.database_url or f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}")
        try:
            lines = await breakdown(store, args.k, args.turns, args.warmup)
        finally:
            await store.close()
    print(f"the activities of a K = {args.k} turn ({store.dialect}), {args.turns} turns, CPU of this thread:")
    print("\n".join(lines))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--k", type=int, default=8, help="tool-calling iterations per turn (default 8)")
    parser.add_argument("--turns", type=int, default=100, help="turns timed (default 100)")
    parser.add_argument("--warmup", type=int, default=10, help="turns before them (default 10)")
    parser.add_argument("--database-url", help="the store (default: a temporary SQLite file)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
