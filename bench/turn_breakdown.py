"""Where a sequential turn's time goes, from its history: ``python -m bench.turn_breakdown`` (issue 9).

Runs the :mod:`bench.peers` workload (K tool-calling iterations, then an answer) back to back on bare Temporal (the
floor, :mod:`bench.peers.bare_app`) and on TurnKit (:mod:`bench.peers.turnkit_app`) on SQLite and, with
``--database-url``, on PostgreSQL; each system on its own dev server with the server's task loading tuned
(``turnkit._temporal.devserver.fast_task_loading_args``), so that the engines' own costs show. After each turn it reads
the turn workflow's history and sums, per turn:

- the activities' run (``ActivityTaskStarted`` → ``ActivityTaskCompleted``), model calls and tool calls apart;
- the workflow tasks' run (``WorkflowTaskStarted`` → ``WorkflowTaskCompleted``) and their wait to start;

and for TurnKit, measured in the worker: the time spent inside its model and tool activities' code, and the wall and
the thread CPU of its store transactions (``Store._transaction``, wrapped). Medians over the turns.

The history's times are the server's, to the millisecond: read the sums, not single events.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import statistics
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, Callable
from typing import Any

from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from bench.peers import bare_app, turnkit_app
from bench.peers.serve import temporal_cli
from turnkit._activities.model import ModelActivities
from turnkit._activities.tools import ToolActivities
from turnkit._temporal.devserver import fast_task_loading_args
from turnkit._temporal.process import exit_process
from turnkit.store.store import Store

#: What the worker measured during the current turn (TurnKit only), in seconds (and a count of transactions).
_measured: defaultdict[str, float] = defaultdict(float)


def _timed_activity(cls: type[Any], name: str, label: str) -> None:
    """Wrap the activity method ``cls.name`` so that its wall time adds to ``_measured[label]``."""
    method: Callable[..., Any] = getattr(cls, name)

    @functools.wraps(method)  # keeps the activity's definition (an attribute of the function)
    async def timed(self: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return await method(self, *args)
        finally:
            _measured[label] += time.perf_counter() - started

    setattr(cls, name, timed)


def _timed_transactions() -> None:
    """Wrap ``Store._transaction`` so that each transaction's wall and thread CPU add to ``_measured``."""
    transaction = Store._transaction  # pyright: ignore[reportPrivateUsage]

    @contextlib.asynccontextmanager
    async def timed(self: Store) -> AsyncGenerator[Any, None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        async with transaction(self) as connection:
            yield connection
        _measured["store transactions, wall"] += time.perf_counter() - wall
        _measured["store transactions, thread CPU"] += time.thread_time() - cpu
        _measured["store transactions"] += 0.001  # shown in ms: a count

    Store._transaction = timed  # type: ignore[method-assign]  # pyright: ignore[reportPrivateUsage]


def _history_sums(events: Any) -> dict[str, float]:
    """Seconds per kind of step in one turn workflow's history (see the module docstring)."""
    sums: defaultdict[str, float] = defaultdict(float)
    scheduled: dict[int, str] = {}
    started: dict[int, float] = {}
    task_scheduled = task_started = 0.0
    for event in events:
        at = event.event_time.ToDatetime().timestamp()
        kind = event.WhichOneof("attributes")
        if kind == "activity_task_scheduled_event_attributes":
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = "model activities, run" if "model" in name else "tool activities, run"
        elif kind == "activity_task_started_event_attributes":
            started[event.activity_task_started_event_attributes.scheduled_event_id] = at
        elif kind == "activity_task_completed_event_attributes":
            sid = event.activity_task_completed_event_attributes.scheduled_event_id
            sums[scheduled[sid]] += at - started[sid]
        elif kind == "workflow_task_scheduled_event_attributes":
            task_scheduled = at
        elif kind == "workflow_task_started_event_attributes":
            task_started = at
            sums["workflow tasks, wait to start"] += at - task_scheduled
        elif kind == "workflow_task_completed_event_attributes":
            sums["workflow tasks, run"] += at - task_started
    return sums


async def _breakdown(name: str, system: Any, flags: list[str], k: int, turns: int, warmup: int) -> dict[str, float]:
    """Median milliseconds per row of the table for ``turns`` K-iteration turns of ``system`` (``flags``: the dev
    server flags its module asks for)."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_cli(),
        dev_server_extra_args=[*fast_task_loading_args(), *flags],
        dev_server_log_level="never",
    )
    rows: dict[str, list[float]] = {}
    try:
        await system.open(env.client.service_client.config.target_host)
        client: Client = system.client
        try:
            for _ in range(warmup):
                await system.turn(k)
            for _ in range(turns):
                _measured.clear()
                started = time.perf_counter()
                workflow_ids = await system.turn(k)
                sums = {"turn, wall": time.perf_counter() - started}
                history = await client.get_workflow_handle(workflow_ids[-1]).fetch_history()
                sums |= _history_sums(history.events)
                sums |= _measured
                for row, seconds in sums.items():
                    rows.setdefault(row, []).append(seconds)
        finally:
            await system.close()
    finally:
        await env.shutdown()
    print(f"  {name} done", flush=True)
    return {row: statistics.median(values) * 1000 for row, values in rows.items()}


async def main(args: argparse.Namespace) -> None:
    _timed_activity(ModelActivities, "model", "TurnKit's model activity code")
    _timed_activity(ToolActivities, "run_tool", "TurnKit's tool activity code")
    _timed_transactions()
    systems: list[tuple[str, Callable[[], Any], list[str]]] = [
        ("bare Temporal", bare_app.System, []),
        ("TurnKit, SQLite", turnkit_app.System, turnkit_app.SERVER_FLAGS),
    ]
    if args.database_url:
        postgresql = functools.partial(turnkit_app.System, database_url=args.database_url)
        systems.append(("TurnKit, PostgreSQL", postgresql, turnkit_app.SERVER_FLAGS))
    columns = {
        name: await _breakdown(name, make(), flags, args.k, args.turns, args.warmup) for name, make, flags in systems
    }
    order = [
        "turn, wall",
        "model activities, run",
        "tool activities, run",
        "workflow tasks, run",
        "workflow tasks, wait to start",
        "TurnKit's model activity code",
        "TurnKit's tool activity code",
        "store transactions, wall",
        "store transactions, thread CPU",
        "store transactions",
    ]
    print(
        f"\nK = {args.k}, {args.turns} turns back to back after {args.warmup}, tuned dev server; medians, ms per turn"
    )
    print(f"| {'':34} | " + " | ".join(f"{name:>20}" for name in columns) + " |")
    for row in order:
        cells = []
        for values in columns.values():
            value = values.get(row)
            count = row == "store transactions"
            cells.append(f"{'-' if value is None else f'{value:.0f}' if count else f'{value:.1f}':>20}")
        label = f"{row} (count)" if row == "store transactions" else row
        print(f"| {label:34} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--k", type=int, default=3, help="tool-calling iterations per turn (default 3)")
    parser.add_argument("--turns", type=int, default=12, help="measured turns per system (default 12)")
    parser.add_argument("--warmup", type=int, default=5, help="turns before the measured ones (default 5)")
    parser.add_argument("--database-url", help="also TurnKit on this PostgreSQL store (postgresql+asyncpg://…)")
    asyncio.run(main(parser.parse_args()))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
