"""Where PostgreSQL's server CPU goes in a TurnKit turn: ``python -m bench.pg_server_cost`` (issue 37, target 2).

Needs ``TURNKIT_BENCH_POSTGRES_URL`` (e.g. ``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``); a scratch
database is created next to the one it names and dropped afterwards. The server's processes must be readable in
``/proc`` (a local server): CPU is each backend's ``/proc/<pid>/schedstat`` run time (nanoseconds, unlike
``/proc/<pid>/stat``'s 10 ms ticks), read by this process around what it measures. ``pg_stat_statements`` is not
needed (it must be preloaded, which takes a restart).

Part 1, one turn of K iterations of the :mod:`bench.peers` workload (model and tool as activities, on an in-process
worker and its own dev server), after a K = 1 warm-up turn:

- **per statement kind**: each store statement's backend CPU, from before the client sends it to when its result is
  back (``before_cursor_execute`` / ``after_cursor_execute``), and the driver transaction's ``BEGIN`` and ``COMMIT``
  (sent by ``DirectConnection`` past the events) the same way; summed by kind over the turn, with counts;
- **the rest**: every backend of the scratch database over the turn, minus the statements' sum (work the backends do
  between statements: statistics flushes, and a statement's tail after its result was sent);
- **every postgres process** on the machine over the turn (WAL writer, checkpointer… and any other user's backends);
- **WAL** bytes over the turn (``pg_current_wal_lsn()``: the server's, so other users' writes count too);
- **row updates** per table (``pg_stat_user_tables``: ``n_tup_upd`` and how many were HOT, ``n_tup_hot_upd``), once
  the store's backends flushed their counts (a backend flushes them when idle, at most once a second);
- **statements new on their connection** apart (``[new on its connection]``): where they are prepared, and planned
  anew for their first five executions.

The wait for those counts leaves the pool idle for a few seconds: a connection idle for longer than
``IDLE_BEFORE_PING`` is pinged at its next checkout (``turnkit/store/idle_ping.py``), which lands in "the rest".

Part 2, micro-benchmarks on one asyncpg connection of the scratch database, backend CPU per operation (median of
rounds): a ``SELECT 1`` round trip; an empty ``BEGIN``/``COMMIT`` pair; the floor's write (``bench/peers/
bare_pg_app.py``: one ``INSERT ... ON CONFLICT DO NOTHING`` in autocommit); and on a copy of a turn row of the
measured turn (a table ``LIKE turnkit_turns INCLUDING ALL``: the same six indexes), in autocommit: an update of
``heartbeat_at`` and ``updated_at`` (indexed: never HOT), of ``usage`` alone (HOT), of ``options`` with its own value
and ``updated_at`` (the claim's JSONB rewrite), and a ``SELECT ... FOR UPDATE`` of the row inside ``BEGIN``/``COMMIT``
against the same ``SELECT`` without the lock.

Part 3 (``--burst N``, default 40), as the peers benchmark measures throughput: N turns of K iterations started at
once, twice on the same worker and pool: the store backends' CPU per turn (those the pool opened and closed
meanwhile included, read as they close), the share of it in statements run for the first time on their connection
(where they are prepared, and the first five planned anew), and the connections opened and closed; and the last
burst's statements by kind, per turn (the pool warm: what a turn costs once every connection has run every
statement).

Part 4: each read of the turn (its last of each kind, with its arguments) run again on its own connection, planned
for each execution, planned once, and as PostgreSQL chooses (:func:`plans`), with EXPLAIN ANALYZE's times.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import make_url
from temporalio.client import Client

from bench.peers import workload
from bench.peers.turnkit_app import AGENT
from bench.store_work import postgres_database, turnkit_dev_server
from turnkit._temporal.process import exit_process
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.store.postgres_direct import DirectConnection


def run_ns(pid: int) -> int:
    """The process's CPU time so far, in nanoseconds (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (FileNotFoundError, ProcessLookupError):
        return 0


def postgres_pids() -> list[int]:
    """Every ``postgres`` process on this machine."""
    pids: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as f:
                    if f.read().strip() == "postgres":
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def kind(sql: str) -> str:
    """A short label for a store statement: its verb (or CTEs), the store tables it names, its looks, its lock."""
    text = " ".join(sql.split())
    if text in ("BEGIN", "COMMIT", "ROLLBACK"):
        return text
    ctes = re.findall(r"(?:WITH|,) (\w+) AS \((?:INSERT|UPDATE|SELECT|DELETE)", text)
    head = f"WITH {'+'.join(ctes)}" if text.startswith("WITH") else text.split(" ", 1)[0]
    tables = sorted({t.removeprefix("turnkit_") for t in re.findall(r"(?:FROM|JOIN|UPDATE|INTO) (turnkit_\w+)", text)})
    looks = sorted(set(re.findall(r" (look_\w+)\.", text)))
    lock = " FOR UPDATE" if "FOR UPDATE" in text else ""
    return f"{head} {','.join(tables)}{' ' + ','.join(looks) if looks else ''}{lock}"


@dataclass
class Tally:
    """Backend CPU by statement kind."""

    ns: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    count: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: The last statement of each kind and its arguments (for its plan, :func:`plans`).
    samples: dict[str, tuple[str, Any]] = field(default_factory=dict)
    on: bool = False

    def add(self, label: str, ns: int, sample: tuple[str, Any] | None = None) -> None:
        if self.on:
            self.ns[label] += ns
            self.count[label] += 1
            if sample is not None:
                self.samples[label] = sample


@dataclass
class Meter:
    """What :func:`instrument` adds to: the current phase's :class:`Tally`; and the pool's connections opened, and
    the CPU of those it closed (read just before, as their backends then exit)."""

    tally: Tally = field(default_factory=Tally)
    opened: int = 0
    closed: dict[int, int] = field(default_factory=dict[int, int])


_NEW: Final = " [new on its connection]"


@dataclass
class Burst:
    """The store backends' CPU over a burst of turns started at once (ns), and the pool's connections."""

    turns: int
    total: int
    opened: int
    closed: int
    new_statements: int  # statements run for the first time on their connection (prepared then)
    statements: int
    tally: Tally


def instrument(store: Store, meter: Meter) -> None:
    """Time every statement's backend CPU (see the module docstring), and count the pool's connections."""
    engine = store.engine.sync_engine

    @event.listens_for(engine, "connect")
    def _connect(_dbapi_connection: Any, _record: Any) -> None:
        meter.opened += 1

    @event.listens_for(engine, "close")
    def _close(dbapi_connection: Any, _record: Any) -> None:
        pid = dbapi_connection.driver_connection.get_server_pid()
        meter.closed[pid] = run_ns(pid)

    started: dict[int, tuple[int, int]] = {}
    seen: set[tuple[int, str]] = set()  # (backend, statement) pairs run before: its prepared statement exists

    def pid_of(conn: Any) -> int:
        return conn.connection.driver_connection.get_server_pid()

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, _cursor: Any, _statement: str, _params: Any, _context: Any, _many: bool) -> None:
        pid = pid_of(conn)
        started[id(conn)] = (pid, run_ns(pid))

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, _cursor: Any, statement: str, params: Any, _context: Any, _many: bool) -> None:
        pid, before = started.pop(id(conn), (0, 0))
        if pid:
            first = (pid, statement) not in seen
            seen.add((pid, statement))
            label = kind(statement) + (_NEW if first else "")
            meter.tally.add(label, run_ns(pid) - before, (statement, params))

    def timed(name: str, method: Callable[[DirectConnection], Awaitable[None]]) -> Callable[..., Awaitable[None]]:
        async def wrapper(self: DirectConnection) -> None:
            sends = name == "BEGIN" or self._in_transaction  # pyright: ignore[reportPrivateUsage]
            pid = self._driver().connection.get_server_pid() if sends else 0  # pyright: ignore[reportPrivateUsage]
            before = run_ns(pid) if pid else 0
            await method(self)
            if pid:
                meter.tally.add(name, run_ns(pid) - before)

        return wrapper

    DirectConnection._begin_on_driver = timed("BEGIN", DirectConnection._begin_on_driver)  # pyright: ignore
    DirectConnection.commit = timed("COMMIT", DirectConnection.commit)  # type: ignore[method-assign]


async def backend_pids(admin: asyncpg.Connection, database: str) -> list[int]:
    rows = await admin.fetch(
        "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", database
    )
    return [row["pid"] for row in rows]


async def table_updates(admin: asyncpg.Connection) -> dict[str, tuple[int, int, int]]:
    rows = await admin.fetch(
        "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname LIKE 'turnkit_%'"
    )
    return {row["relname"]: (row["n_tup_ins"], row["n_tup_upd"], row["n_tup_hot_upd"]) for row in rows}


async def counts_flushed(admin: asyncpg.Connection) -> None:
    """Wait (up to 20 s) until the table counts hold every message row: a backend flushes its counts when idle, at
    most once a second, or 10 s after its last flush was refused, and on exit."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rows = await admin.fetchval("SELECT count(*) FROM turnkit_messages")
        counted = await admin.fetchval("SELECT n_tup_ins FROM pg_stat_user_tables WHERE relname = 'turnkit_messages'")
        if counted >= rows:
            return
        await asyncio.sleep(0.1)
    print("table counts not flushed after 20 s: the row counts below may miss some", file=sys.stderr)


async def burst(tk: TurnKit, meter: Meter, admin: asyncpg.Connection, database: str, n: int, k: int) -> Burst:
    """Part 3 (see the module docstring): ``n`` turns of ``k`` iterations started at once."""
    before = {pid: run_ns(pid) for pid in await backend_pids(admin, database)}
    meter.closed.clear()
    opened = meter.opened
    meter.tally = Tally(on=True)

    async def one() -> None:
        conversation = await tk.conversation(AGENT)
        turn = await conversation.ask(workload.prompt(k))
        if turn.status != "completed":
            raise RuntimeError(f"burst: turn {turn.id} ended {turn.status}: {turn.error}")

    await asyncio.gather(*(one() for _ in range(n)))
    meter.tally.on = False
    alive = {pid: run_ns(pid) for pid in await backend_pids(admin, database)}
    total = sum(ns - before.get(pid, 0) for pid, ns in {**meter.closed, **alive}.items())
    first = sum(ns for label, ns in meter.tally.ns.items() if label.endswith(_NEW))
    statements = sum(meter.tally.ns.values())
    return Burst(n, total, meter.opened - opened, len(meter.closed), first, statements, meter.tally)


async def one_turn(address: str, url: str, k: int, bursts: int) -> dict[str, Any]:
    """Parts 1 and 3 (see the module docstring)."""
    database = make_url(url).database or ""
    admin = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    store = await Store.open(url)
    meter = Meter()
    tally = meter.tally
    instrument(store, meter)
    out: dict[str, Any] = {}
    try:
        client = await Client.connect(address, plugins=[TurnKitPlugin(store)])
        tk = TurnKit(client, store, task_queue=f"bench-pg-cost-{uuid.uuid4().hex[:8]}")
        async with tk.worker():
            for turn_k in (1, k):
                if turn_k == k:
                    await counts_flushed(admin)
                    stats_before = await table_updates(admin)
                    pids = await backend_pids(admin, database)
                    every = postgres_pids()
                    ns_before = {pid: run_ns(pid) for pid in pids}
                    all_before = {pid: run_ns(pid) for pid in every}
                    wal_before = await admin.fetchval("SELECT pg_current_wal_lsn()")
                    tally.on = True
                conversation = await tk.conversation(AGENT)
                turn = await conversation.ask(workload.prompt(turn_k))
                tally.on = False
                if turn.status != "completed":
                    raise RuntimeError(f"K={turn_k}: turn {turn.id} ended {turn.status}: {turn.error}")
                workload.check(turn_k, turn.output_text)
            out["wal"] = await admin.fetchval("SELECT pg_current_wal_lsn() - $1::pg_lsn", wal_before)
            pids_after = await backend_pids(admin, database)
            out["backends"] = sum(run_ns(pid) - ns_before.get(pid, 0) for pid in pids_after)
            out["every_postgres"] = sum(run_ns(pid) - all_before.get(pid, 0) for pid in postgres_pids())
            out["new_backends"] = len(set(pids_after) - set(pids))
            out["turn_id"] = turn.id
            out["options_bytes"] = await admin.fetchval(
                "SELECT pg_column_size(options) FROM turnkit_turns WHERE uid = $1", turn.id
            )
            await counts_flushed(admin)
            after = await table_updates(admin)
            out["bursts"] = [await burst(tk, meter, admin, database, bursts, k) for _ in range(2)] if bursts else []
    finally:
        await store.close()
    await admin.close()
    out["tables"] = {
        name: tuple(a - b for a, b in zip(counts, stats_before.get(name, (0, 0, 0)), strict=True))
        for name, counts in after.items()
    }
    out["tally"] = tally
    return out


async def per_op(connection: asyncpg.Connection, n: int, op: Callable[[int], Awaitable[Any]], rounds: int = 3) -> float:
    """Backend CPU per call of ``op``, in µs: the median of ``rounds`` rounds of ``n`` calls."""
    pid = connection.get_server_pid()
    figures: list[float] = []
    for _ in range(rounds):
        before = run_ns(pid)
        for i in range(n):
            await op(i)
        figures.append((run_ns(pid) - before) / n / 1000)
    return statistics.median(figures)


async def micro(url: str, turn_id: str, n: int) -> dict[str, float]:
    """Part 2 (see the module docstring)."""
    c = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    out: dict[str, float] = {}
    try:
        one = await c.prepare("SELECT 1")
        out["SELECT 1 round trip"] = await per_op(c, n, lambda _: one.fetchval())

        async def begin_commit(_: int) -> None:
            await c.execute("BEGIN")
            await c.execute("COMMIT")

        out["BEGIN + COMMIT, nothing written"] = await per_op(c, n, begin_commit)
        await c.execute(
            "CREATE TABLE floor_step (workflow_id text NOT NULL, step integer NOT NULL, kind text NOT NULL, "
            "payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (workflow_id, step))"
        )
        floor = await c.prepare(
            "INSERT INTO floor_step (workflow_id, step, kind, payload)"
            " VALUES ($1, $2, 'model', $3) ON CONFLICT DO NOTHING"
        )
        run = uuid.uuid4().hex
        out["floor's write: INSERT ON CONFLICT DO NOTHING, autocommit"] = await per_op(
            c, n, lambda i: floor.fetch(f"{run}-{i // 1000}-{uuid.uuid4().hex[:6]}", i, '{"text": "answer"}')
        )
        await c.execute("CREATE TABLE turns_copy (LIKE turnkit_turns INCLUDING ALL)")
        await c.execute("INSERT INTO turns_copy SELECT * FROM turnkit_turns WHERE uid = $1", turn_id)
        options = await c.fetchval("SELECT options::text FROM turns_copy WHERE uid = $1", turn_id)
        times = await c.prepare("UPDATE turns_copy SET heartbeat_at = now(), updated_at = now() WHERE uid = $1")
        usage = await c.prepare("UPDATE turns_copy SET usage = $2::jsonb WHERE uid = $1")
        opts = await c.prepare("UPDATE turns_copy SET options = $2::jsonb, updated_at = now() WHERE uid = $1")
        look = await c.prepare("SELECT * FROM turns_copy WHERE uid = $1")
        lock = await c.prepare("SELECT * FROM turns_copy WHERE uid = $1 FOR UPDATE")
        await c.execute("SELECT pg_stat_force_next_flush()")
        out["UPDATE turn heartbeat_at, updated_at (not HOT), autocommit"] = await per_op(
            c, n, lambda _: times.fetch(turn_id)
        )
        out["UPDATE turn usage alone (HOT), autocommit"] = await per_op(
            c, n, lambda i: usage.fetch(turn_id, f'{{"input_tokens": {i}}}')
        )
        out["UPDATE turn options (same value) + updated_at, autocommit"] = await per_op(
            c, n, lambda _: opts.fetch(turn_id, options)
        )

        async def read(_: int) -> None:
            await c.execute("BEGIN")
            await look.fetch(turn_id)
            await c.execute("COMMIT")

        async def locked(_: int) -> None:
            await c.execute("BEGIN")
            await lock.fetch(turn_id)
            await c.execute("COMMIT")

        out["BEGIN + SELECT turn + COMMIT"] = await per_op(c, n, read)
        out["BEGIN + SELECT turn FOR UPDATE + COMMIT"] = await per_op(c, n, locked)
        out["turn options JSONB bytes"] = float(len(options))
    finally:
        await c.close()
    return out


#: Per statement kind: µs planned each time, planned once, as PostgreSQL chooses; EXPLAIN's planning and execution ms.
Planned = dict[str, tuple[float, float, float, float, float]]


async def plans(url: str, tally: Tally, n: int) -> Planned:
    """Per read statement kind of the turn (its last one, with its arguments), backend CPU per execution (µs) of its
    prepared statement planned for each execution (``plan_cache_mode = force_custom_plan``: what PostgreSQL does for a
    prepared statement's first five executions), planned once (``force_generic_plan``) and as PostgreSQL chooses
    after ten executions (``auto``), each inside ``BEGIN`` / ``ROLLBACK``; and EXPLAIN ANALYZE's planning and
    execution times (ms) of one custom-planned execution."""
    c = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(hide_password=False))
    out: Planned = {}
    try:
        for label, (sql, params) in sorted(tally.samples.items()):
            if not sql.lstrip().upper().startswith("SELECT"):
                continue
            args = list(params or ())
            figures: list[float] = []
            for mode in ("force_custom_plan", "force_generic_plan", "auto"):
                await c.execute(f"SET plan_cache_mode = {mode}")
                statement = await c.prepare(sql)
                for _ in range(10):  # past the five custom plans PostgreSQL makes before it weighs a generic one
                    await c.execute("BEGIN")
                    await statement.fetch(*args)
                    await c.execute("ROLLBACK")

                async def run(_: int, statement: Any = statement, args: list[Any] = args) -> None:
                    await c.execute("BEGIN")
                    await statement.fetch(*args)
                    await c.execute("ROLLBACK")

                figures.append(await per_op(c, n, run) - await per_op(c, n, _begin_rollback(c)))
            await c.execute("RESET plan_cache_mode")
            await c.execute("BEGIN")
            explained = await c.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
            await c.execute("ROLLBACK")
            plan = json.loads(explained)[0]
            out[label] = (figures[0], figures[1], figures[2], plan["Planning Time"], plan["Execution Time"])
    finally:
        await c.close()
    return out


def _begin_rollback(c: asyncpg.Connection) -> Callable[[int], Awaitable[None]]:
    async def run(_: int) -> None:
        await c.execute("BEGIN")
        await c.execute("ROLLBACK")

    return run


def report(k: int, turn: dict[str, Any], ops: dict[str, float], planned: Planned) -> None:
    tally: Tally = turn["tally"]
    statements = sum(tally.ns.values())
    trips = sum(tally.count.values())
    print(f"PostgreSQL server CPU of one K={k} turn (bench.peers workload, model and tool activities)")
    print()
    print(f"{'statement kind':<92}{'count':>6}{'µs total':>10}{'µs each':>9}")
    for label, ns in sorted(tally.ns.items(), key=lambda item: -item[1]):
        count = tally.count[label]
        print(f"{label[:91]:<92}{count:>6}{ns / 1000:>10.0f}{ns / 1000 / count:>9.0f}")
    print(f"{'statements, BEGIN and COMMIT':<92}{trips:>6}{statements / 1000:>10.0f}")
    print(f"{'the store backends between statements':<92}{'':>6}{(turn['backends'] - statements) / 1000:>10.0f}")
    print(f"{'the store backends, in all':<92}{'':>6}{turn['backends'] / 1000:>10.0f}")
    print(f"{'every postgres process':<92}{'':>6}{turn['every_postgres'] / 1000:>10.0f}")
    print(f"WAL over the turn: {turn['wal']} bytes; backends opened during it: {turn['new_backends']}")
    print(f"turn options: {turn['options_bytes']} bytes stored")
    for i, b in enumerate(turn["bursts"]):
        print(
            f"burst {i + 1}: {b.turns} K={k} turns at once: store backends {b.total / b.turns / 1000:.0f} µs per turn, "
            f"of which statements new on their connection {b.new_statements / b.turns / 1000:.0f} µs; "
            f"{b.opened} connections opened, {b.closed} closed"
        )
    if turn["bursts"]:
        last: Burst = turn["bursts"][-1]
        print("the last burst, per turn: statements (count, µs), BEGIN and COMMIT, by kind, and the rest")
        rows = sorted(last.tally.ns.items(), key=lambda item: -item[1])
        for label, ns in rows:
            print(f"  {label[:89]:<90}{last.tally.count[label] / last.turns:>6.1f}{ns / last.turns / 1000:>10.0f}")
        rest = (last.total - last.statements) / last.turns / 1000
        print(f"  {'between statements, and connections opened':<90}{'':>6}{rest:>10.0f}")
    print()
    print(f"{'table':<28}{'inserted':>9}{'updated':>9}{'of which HOT':>14}")
    for name, (ins, upd, hot) in sorted(turn["tables"].items()):
        if ins or upd:
            print(f"{name:<28}{ins:>9}{upd:>9}{hot:>14}")
    print()
    print("backend CPU per operation, one asyncpg connection (µs, median of 3 rounds)")
    for label, us in ops.items():
        print(f"  {label:<64}{us:>8.1f}")
    print()
    print("the turn's reads, one execution (BEGIN/ROLLBACK's own cost taken off): backend CPU (µs) planned each time /")
    print("planned once / as PostgreSQL chooses after 10 executions; EXPLAIN ANALYZE planning / execution (ms)")
    for label, (custom, generic, auto, planning, execution) in planned.items():
        print(f"  {label[:84]:<84}{custom:>7.0f}{generic:>7.0f}{auto:>7.0f}{planning:>8.3f}{execution:>8.3f}")


async def main(args: argparse.Namespace) -> None:
    postgres = os.environ.get("TURNKIT_BENCH_POSTGRES_URL")
    if not postgres:
        sys.exit("set TURNKIT_BENCH_POSTGRES_URL")
    async with turnkit_dev_server() as address, postgres_database(postgres) as url:
        turn = await one_turn(address, url, args.k, args.burst)
        ops = await micro(url, turn["turn_id"], args.n)
        planned = await plans(url, turn["tally"], max(args.n // 5, 20))
    report(args.k, turn, ops, planned)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=3, help="tool-calling iterations of the measured turn (default 3)")
    parser.add_argument("--burst", type=int, default=40, help="turns started at once in part 3, twice (0: none)")
    parser.add_argument("--n", type=int, default=1000, help="operations per micro-benchmark round (default 1000)")
    asyncio.run(main(parser.parse_args()))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
