"""CPU per turn in the process that runs the client and the worker: ``python -m bench.cpu_profile``.

Runs the ``bench/peers`` workload on TurnKit (:mod:`bench.peers.turnkit_app`: a fresh conversation per turn, K
tool-calling iterations with the scripted model, then the final answer) on its own dev server, tuned as the tests'
(``history.transferProcessorMaxPollRPS=1000``, so the server's rate limit does not hide the engine), with the store
in a temporary SQLite file (or ``--database-url``). After a warm-up it measures:

1. **CPU per turn**, several rounds, each of ``--turns`` turns started at once (the throughput workload): the process's
   ``time.process_time()`` over the round, divided by the turns, and the same split by thread from
   ``/proc/self/task/*/stat``: the event loop (client, activities, store), the workflow threads (the lane and turn
   workflows, sandbox included), aiosqlite's connection threads, and the SDK's Rust core threads. Medians. With
   ``--against-bare``, bare Temporal's workflow (:mod:`bench.peers.bare_app`: the same activities, nothing around
   them) runs in this process on the same dev server too, its bursts alternated with TurnKit's, and the report
   says what TurnKit adds per turn, by thread and on the dev server, and which of the dev server's own counters
   (requests, persistence calls, tasks, timers, payload bytes) differ per turn (:mod:`bench.server_work`).
2. **The activities' own code**: in rounds of ``--sequential`` turns one after another, the event loop thread's CPU
   inside each activity (:class:`ActivityCpu`: TurnKit's interceptors and its store included, the SDK's task
   handling around it not), by activity type: calls per turn, the median call, the sum per turn and its share of
   the process's CPU per turn in those rounds.
3. **Store trips per turn**: one more back-to-back round with SQLAlchemy's engine events counted: transactions
   (``begin``) and SQL statements (``after_cursor_execute``, SQLite's ``BEGIN IMMEDIATE`` included), per turn, and
   which activity (or "outside an activity": the client, the workflow's local work) ran them. Deterministic.
4. **Where the Python CPU goes** (``--profile``, on by default): one more round under ``cProfile`` in every Python
   thread (the worker is opened after the hook is installed, so its threads are profiled from their start; the
   counters are cleared before the measured round). Self time is grouped by library (sandbox, temporalio,
   pydantic, SQLAlchemy, sqlite, json, asyncio, TurnKit's own code...), then the top functions by self time and by
   cumulative time, in ms per turn. Timed with each thread's CPU clock (``time.thread_time``), so
   waiting costs nothing; cProfile roughly doubles the CPU of what it profiles: read the shares.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event
from temporalio import activity
from temporalio.client import Interceptor as ClientInterceptor
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput
from temporalio.worker import Interceptor as WorkerInterceptor

from bench import server_work
from bench.action_counts import free_port
from bench.peers import bare_app
from bench.peers.serve import server_cpu
from bench.peers.turnkit_app import System
from turnkit._temporal.process import exit_process

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")

# --- CPU by thread ---------------------------------------------------------------------------------------------------


def _thread_group(name: str) -> str:
    """The group a thread's CPU is reported under (by its Python name, else its kernel name)."""
    if name.startswith("temporal_workflow_"):
        return "workflow threads (lane + turn, sandbox)"
    if name == "MainThread":
        return "event loop (client, activities, store)"
    if name.startswith("Thread-") or name.startswith("aiosqlite"):
        return "other Python threads (aiosqlite, executors)"
    return "Rust core / native threads"


def cpu_by_thread() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of every thread of this process: tid -> (name, seconds)."""
    names = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    found: dict[int, tuple[str, float]] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended meanwhile
            continue
        # "tid (comm) state ...": comm may hold spaces, so split after its closing parenthesis.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime
        tid = int(task.name)
        found[tid] = (names.get(tid, comm), seconds)
    return found


def by_group(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two :func:`cpu_by_thread` snapshots, by :func:`_thread_group`."""
    groups: dict[str, float] = defaultdict(float)
    for tid, (name, seconds) in after.items():
        groups[_thread_group(name)] += seconds - before.get(tid, (name, 0.0))[1]
    return dict(groups)


@dataclass
class Round:
    """One measured round: wall time, process CPU and CPU by thread group, all in seconds."""

    turns: int
    wall: float
    cpu: float
    groups: dict[str, float] = field(default_factory=dict[str, float])


async def burst(system: Any, k: int, turns: int) -> None:
    await asyncio.gather(*(system.turn(k) for _ in range(turns)))


async def measure(run: Callable[[], Any], turns: int) -> Round:
    threads_before, cpu_before, wall_before = cpu_by_thread(), time.process_time(), time.perf_counter()
    server_before = server_cpu()
    await run()
    wall, cpu = time.perf_counter() - wall_before, time.process_time() - cpu_before
    groups = by_group(threads_before, cpu_by_thread())
    groups["(the dev server process, not in the total)"] = server_cpu() - server_before
    return Round(turns, wall, cpu, groups)


# --- activities' own code -----------------------------------------------------------------------------------------


class ActivityCpu(ClientInterceptor, WorkerInterceptor):
    """The CPU each activity's own code spends, by activity type, while :attr:`on`: the event loop thread's CPU clock
    around the activity, TurnKit's interceptors and its store included; the SDK's work to receive the task and
    report its result is outside. A client interceptor that is a worker interceptor too wraps every other one.

    Meant for turns run one after another, where one activity runs at a time: with many at once, each would be
    charged the others' work done between its awaits."""

    def __init__(self) -> None:
        self.on = False
        self.spent: dict[str, list[float]] = defaultdict(list)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _TimedActivity(next, self)


class _TimedActivity(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, clock: ActivityCpu) -> None:
        super().__init__(next)
        self._clock = clock

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        if not self._clock.on:
            return await super().execute_activity(input)
        start = time.thread_time()
        try:
            return await super().execute_activity(input)
        finally:
            self._clock.spent[_running_activity()].append(time.thread_time() - start)


def report_activity_cpu(clock: ActivityCpu, turns: int, process_per_turn: float) -> None:
    """Per activity type: calls per turn, median CPU per call, CPU per turn; and their sum against the process's."""
    total = sum(sum(values) for values in clock.spent.values()) / turns
    print(
        f"\nthe activities' own code ({turns} turns back to back, each round): {total * 1000:.1f} ms per turn, "
        f"{total / process_per_turn:.0%} of the process's CPU per turn"
    )
    for kind in sorted(clock.spent, key=lambda name: -sum(clock.spent[name])):
        values = clock.spent[kind]
        print(
            f"  {kind:<50}{len(values) / turns:>5.1f} per turn, {statistics.median(values) * 1000:6.2f} ms each "
            f"(median), {sum(values) / turns * 1000:6.1f} ms per turn"
        )


# --- store trips --------------------------------------------------------------------------------------------------


@dataclass
class Trips:
    """Transactions and SQL statements on the store's engine, by the activity type that ran them."""

    transactions: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    statements: dict[str, int] = field(default_factory=lambda: defaultdict(int))


def _running_activity() -> str:
    try:
        kind = activity.info().activity_type
    except RuntimeError:  # not in an activity: the client (ask, the submit's reads) or other callers
        return "outside an activity"
    return "tool:<name>" if kind.startswith("tool:") else kind


async def count_trips(system: System, k: int, turns: int) -> Trips:
    """Transactions and statements of ``turns`` back-to-back turns (listeners removed afterwards)."""
    engines = system.store.sync_engines
    trips = Trips()

    def on_begin(_conn: Any) -> None:
        trips.transactions[_running_activity()] += 1

    def on_statement(*_: Any) -> None:
        trips.statements[_running_activity()] += 1

    for engine in engines:
        event.listen(engine, "begin", on_begin)
        event.listen(engine, "after_cursor_execute", on_statement)
    try:
        await _sequential(system, k, turns)
    finally:
        for engine in engines:
            event.remove(engine, "begin", on_begin)
            event.remove(engine, "after_cursor_execute", on_statement)
    return trips


def report_trips(trips: Trips, turns: int) -> None:
    total_tx, total_sql = sum(trips.transactions.values()), sum(trips.statements.values())
    print(
        f"\nstore trips per turn ({turns} turns back to back): {total_tx / turns:.1f} transactions, "
        f"{total_sql / turns:.1f} SQL statements"
    )
    for kind in sorted(trips.statements, key=lambda name: -trips.statements[name]):
        transactions, statements = trips.transactions.get(kind, 0) / turns, trips.statements[kind] / turns
        print(f"  {kind:<50}{transactions:>6.1f} tx {statements:>7.1f} stmts")


# --- cProfile in every thread ----------------------------------------------------------------------------------------


class AllThreads:
    """cProfile in every Python thread started after :meth:`install`, and in the calling thread."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self._lock = threading.Lock()

    def _start_in_thread(self, *_: object) -> None:
        # Runs as the new thread's first profile callback: replace it with a profiler of this thread's own.
        profile = cProfile.Profile(time.thread_time)  # CPU, not wall time: waiting threads cost nothing
        with self._lock:
            self.profiles.append(profile)
        profile.enable()

    def install(self) -> None:
        threading.setprofile(self._start_in_thread)
        self._start_in_thread()

    def clear(self) -> None:
        for profile in list(self.profiles):
            profile.clear()

    def stats(self) -> pstats.Stats:
        """The merged statistics so far (the profilers keep running: read, not stopped)."""
        snapshots: list[_Snapshot] = []
        for profile in list(self.profiles):
            profile.snapshot_stats()
            if profile.stats:  # type: ignore[attr-defined]  # set by snapshot_stats; empty: idle since clear()
                snapshots.append(_Snapshot(dict(profile.stats)))  # type: ignore[attr-defined]
        merged = pstats.Stats(snapshots[0])
        for snapshot in snapshots[1:]:
            merged.add(snapshot)
        return merged

    def uninstall(self) -> None:
        threading.setprofile(None)  # type: ignore[arg-type]
        sys.setprofile(None)


class _Snapshot:
    """What ``pstats.Stats`` loads: an object with ``create_stats`` and ``stats``."""

    def __init__(self, stats: dict[Any, Any]) -> None:
        self.stats = stats

    def create_stats(self) -> None:
        pass


#: Self-time groups, first match wins: (label, substring of the function's file name).
LIBRARIES = (
    ("sandbox (temporalio workflow_sandbox)", "workflow_sandbox"),
    ("temporalio converter", "temporalio/converter"),
    ("temporalio other", "temporalio/"),
    ("pydantic", "pydantic"),
    ("sqlalchemy", "sqlalchemy/"),
    ("aiosqlite / sqlite3", "sqlite"),
    ("asyncpg", "asyncpg"),
    ("json", "json/"),
    ("protobuf / grpc", "google/protobuf"),
    ("asyncio", "asyncio/"),
    ("import machinery", "<frozen importlib"),
    ("importlib", "importlib/"),
    ("logging", "logging/"),
    ("typing", "typing.py"),
    ("turnkit/store", "turnkit/store/"),
    ("workflows/ (TurnKit)", "/workflows/"),
    ("activities/ (TurnKit)", "/activities/"),
    ("turnkit/ other", "/turnkit/"),
    ("bench", "/bench/"),
)


def library(filename: str) -> str:
    for label, part in LIBRARIES:
        if part in filename:
            return label
    if filename == "~":
        return "builtins (C functions)"
    return "other Python"


def report_profile(stats: pstats.Stats, turns: int, top: int) -> None:
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    by_library: dict[str, float] = defaultdict(float)
    builtin_by_name: dict[str, float] = defaultdict(float)
    for (filename, _line, name), (_cc, _nc, tottime, _ct, callers) in raw.items():
        lib = library(filename)
        if lib == "builtins (C functions)":
            # A C function is charged to the library of its callers (weighted by their calls' self time).
            caller_libs: dict[str, float] = defaultdict(float)
            for (caller_file, _l, _n), caller in callers.items():
                caller_libs[library(caller_file)] += caller[2]
            total = sum(caller_libs.values())
            for caller_lib, share in caller_libs.items():
                by_library[f"{caller_lib} (C calls)"] += tottime * (share / total if total else 1 / len(caller_libs))
            if not caller_libs:
                by_library["builtins (C functions)"] += tottime
            builtin_by_name[name] += tottime
        else:
            by_library[lib] += tottime
    total = sum(by_library.values())
    print(f"\nprofiled self time: {total / turns * 1000:.1f} ms per turn (cProfile's overhead included)")
    print(f"  {'group':<52}{'ms/turn':>9}{'share':>8}")
    for lib, seconds in sorted(by_library.items(), key=lambda item: -item[1]):
        if seconds / total >= 0.003:
            print(f"  {lib:<52}{seconds / turns * 1000:>9.2f}{seconds / total:>8.1%}")

    def rows(key: Callable[[tuple[Any, ...]], float], only_ours: bool) -> None:
        entries = sorted(raw.items(), key=lambda item: -key(item[1]))
        shown = 0
        print(f"  {'ms/turn':>8}{'self':>8}{'calls/turn':>11}  function")
        for (filename, line, name), (_cc, nc, tottime, cumtime, _callers) in entries:
            if only_ours and not any(p in filename for p in ("/turnkit/", "/activities/", "/workflows/", "/bench/")):
                continue
            where = filename.split("site-packages/")[-1].split("wt-cpu/")[-1]
            print(
                f"  {key((0, nc, tottime, cumtime, None)) / turns * 1000:>8.2f}{tottime / turns * 1000:>8.2f}"
                f"{nc / turns:>11.1f}  {name} ({where}:{line})"
            )
            shown += 1
            if shown >= top:
                break

    print(f"\ntop {top} functions by self time")
    rows(lambda entry: entry[2], only_ours=False)
    print(f"\ntop {top} functions by cumulative time (coroutines count each resumption)")
    rows(lambda entry: entry[3], only_ours=False)
    print(f"\ntop {top} TurnKit functions (turnkit/, activities/, workflows/) by cumulative time")
    rows(lambda entry: entry[3], only_ours=True)


# --- the run ---------------------------------------------------------------------------------------------------------


def report_rounds(rounds: list[Round], label: str) -> None:
    per_turn = [r.cpu / r.turns * 1000 for r in rounds]
    print(
        f"\n{label}: CPU per turn {statistics.median(per_turn):.1f} ms (median of {len(rounds)}; "
        f"rounds {', '.join(f'{x:.1f}' for x in per_turn)}), "
        f"{statistics.median(r.turns / r.wall for r in rounds):.1f} turns/s"
    )
    groups = sorted({g for r in rounds for g in r.groups})
    for group in groups:
        values = [r.groups.get(group, 0.0) / r.turns * 1000 for r in rounds]
        print(f"  {group:<50}{statistics.median(values):>8.1f} ms/turn")


async def main(args: argparse.Namespace) -> None:
    metrics_port = free_port()
    env = await server_work.start_dev_server(metrics_port)
    try:
        # The timed rounds first, with no profiler anywhere.
        clock = ActivityCpu()
        system = System(
            args.database_url,
            local_tool=args.local_tool,
            sandbox=args.sandbox,
            local_model=args.local_model,
            interceptors=[clock],
        )
        await system.open(env.client.service_client.config.target_host)
        bare = bare_app.System() if args.against_bare else None
        try:
            await _warm_up(system, args)
            if bare is not None:
                await bare.open(env.client.service_client.config.target_host)
                await _warm_up(bare, args)
            rounds, bare_rounds, server_counts = await _burst_rounds(system, bare, args, metrics_port)
            clock.on = True  # one activity at a time: each is charged its own work only
            sequential = [
                await measure(lambda: _sequential(system, args.k, args.sequential), args.sequential)
                for _ in range(args.rounds)
            ]
            clock.on = False
            trips = await count_trips(system, args.k, args.sequential)  # after the timed rounds: listeners cost CPU
        finally:
            if bare is not None:
                await bare.close()
            await system.close()
        stats = None
        if args.profile:
            # A second worker, opened after the hook is installed, so that every thread it starts is profiled.
            profiler = AllThreads()
            profiler.install()
            profiled_system = System(
                args.database_url, local_tool=args.local_tool, sandbox=args.sandbox, local_model=args.local_model
            )
            await profiled_system.open(env.client.service_client.config.target_host)
            try:
                await _warm_up(profiled_system, args)
                profiler.clear()
                await burst(profiled_system, args.k, args.turns)
                stats = profiler.stats()
            finally:
                profiler.uninstall()
                await profiled_system.close()
    finally:
        await env.shutdown()
    store = (args.database_url or "sqlite").split(":")[0].split("+")[0]
    print(f"K = {args.k}, store {store}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
    report_rounds(rounds, f"{args.turns} turns at once")
    if bare_rounds:
        report_rounds(bare_rounds, f"bare Temporal, the same workload on the same dev server, {args.turns} at once")
        report_extra(rounds, bare_rounds)
        server_work.report(server_counts[0], server_counts[1], args.turns)
    report_rounds(sequential, f"{args.sequential} turns back to back")
    report_activity_cpu(
        clock, args.sequential * len(sequential), statistics.median(r.cpu / r.turns for r in sequential)
    )
    report_trips(trips, args.sequential)
    if stats is not None:
        report_profile(stats, args.turns, args.top)
        if args.dump:
            stats.dump_stats(args.dump)  # for pstats: callers, callees


async def _burst_rounds(
    system: System, bare: bare_app.System | None, args: argparse.Namespace, metrics_port: int
) -> tuple[list[Round], list[Round], tuple[list[dict[str, float]], list[dict[str, float]]]]:
    """``--rounds`` bursts of TurnKit, and with ``bare`` as many of bare Temporal, alternated, who goes first
    alternating too: the two are measured in the same minutes of a noisy machine. With ``bare``, also each burst's
    increase of the dev server's counters (TurnKit's, bare Temporal's), read once the server has published them."""
    rounds: list[Round] = []
    bare_rounds: list[Round] = []
    counts: tuple[list[dict[str, float]], list[dict[str, float]]] = ([], [])
    for number in range(args.rounds):
        both: list[tuple[Any, list[Round], list[dict[str, float]]]] = [(system, rounds, counts[0])]
        if bare is not None:
            both.append((bare, bare_rounds, counts[1]))
        for each, into, counted in both if number % 2 == 0 else both[::-1]:
            before: dict[str, float] = {}
            if bare is not None:
                await asyncio.sleep(server_work.PUBLISH_INTERVAL)  # the last burst's counts published
                before = server_work.read_counters(metrics_port)
            into.append(await measure(lambda each=each: burst(each, args.k, args.turns), args.turns))
            if bare is not None:
                await asyncio.sleep(server_work.PUBLISH_INTERVAL)
                after = server_work.read_counters(metrics_port)
                counted.append({key: after[key] - before.get(key, 0.0) for key in after})
    return rounds, bare_rounds, counts


def report_extra(rounds: list[Round], bare_rounds: list[Round]) -> None:
    """TurnKit's CPU per turn above bare Temporal's, in all and by thread group (medians of the rounds)."""

    def per_turn(each: list[Round], group: str | None) -> float:
        return statistics.median((r.cpu if group is None else r.groups.get(group, 0.0)) / r.turns for r in each) * 1000

    print("\nTurnKit above bare Temporal, per turn (median against median):")
    print(f"  {'the process':<50}{per_turn(rounds, None) - per_turn(bare_rounds, None):>+8.1f} ms/turn")
    for group in sorted({g for r in rounds + bare_rounds for g in r.groups}):
        label = "the dev server (its own process)" if group.startswith("(the dev server") else f"  {group}"
        print(f"  {label:<50}{per_turn(rounds, group) - per_turn(bare_rounds, group):>+8.1f} ms/turn")


async def _warm_up(system: Any, args: argparse.Namespace) -> None:
    for _ in range(args.warmup):
        await system.turn(args.k)
    await burst(system, args.k, args.turns)


async def _sequential(system: Any, k: int, turns: int) -> None:
    for _ in range(turns):
        await system.turn(k)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="CPU per TurnKit turn, and where it goes (cProfile)")
    parser.add_argument("--k", type=int, default=1, help="tool-calling iterations per turn (default 1)")
    parser.add_argument("--turns", type=int, default=40, help="turns per round, started at once (default 40)")
    parser.add_argument("--sequential", type=int, default=10, help="turns per back-to-back round (default 10)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds of each kind (default 3)")
    parser.add_argument("--warmup", type=int, default=5, help="back-to-back warm-up turns (default 5)")
    parser.add_argument("--top", type=int, default=30, help="functions listed per table (default 30)")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="skip the cProfile round")
    parser.add_argument("--dump", metavar="FILE", help="also write the profile's pstats to FILE")
    parser.add_argument("--database-url", help="the store (default: a temporary SQLite file)")
    parser.add_argument("--local-tool", action="store_true", help="the tool as @tool(local=True) (a local activity)")
    parser.add_argument(
        "--local-model", action="store_true", help="each model call's first attempt as a local activity"
    )
    parser.add_argument(
        "--no-sandbox", dest="sandbox", action="store_false", help="the worker's workflows unsandboxed (sandbox=False)"
    )
    parser.add_argument("--uvloop", action="store_true", help="run the process on uvloop (pip install uvloop)")
    parser.add_argument(
        "--against-bare",
        action="store_true",
        help="also run bare Temporal's workflow (bench/peers/bare_app.py) in this process, on the same dev server, "
        "its bursts alternated with TurnKit's, and print what TurnKit adds per turn, by thread, and the dev "
        "server's counters that differ per turn (bench/server_work.py)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.uvloop:
        import uvloop

        uvloop.run(main(arguments))
    else:
        asyncio.run(main(arguments))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
