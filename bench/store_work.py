"""Store work per iteration: ``python -m bench.store_work`` (issue 9, "store work independent of the turn's length").

Runs one turn of K iterations for K = 2, 10 and 20 (the :mod:`bench.peers` workload: the scripted model calls the
replay-safe ``lookup`` tool K times, then answers), on a TurnKit with an in-process worker and its own dev server,
on SQLite and, when ``TURNKIT_BENCH_POSTGRES_URL`` is set, on PostgreSQL (a ``turnkit_bench_store_work_<hex>``
database is created next to the one the URL names and dropped afterwards, so the URL's own database is untouched).

Every SQL statement on the store's engine is counted (``before_cursor_execute``) and attributed to the activity
running it (``temporalio.activity.info()``; statements outside an activity are "other"), per activity execution.
Rows read are the rows a ``SELECT`` returned (the async adapters buffer them on the cursor). The read that builds
the model request (the turn's frozen context plus its own messages: a ``SELECT`` on the messages table bounded by
``sequence <=``) is inherent, since the request holds the whole conversation: it is counted apart as "context".

The table gives, per model call (``turnkit.model``) and per tool call (``tool:lookup``): SQL statements, rows read
other than the context, and context rows, as the mean over the turn's calls and for its last call.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import uuid
from collections import defaultdict
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from temporalio import activity
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from bench.peers import workload
from bench.peers.turnkit_app import AGENT
from turnkit._temporal.process import exit_process
from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit, temporal_binary
from turnkit.store import Store

ITERATIONS = (2, 10, 20)
MODEL = "turnkit.model"
TOOL = f"tool:{workload.TOOL_NAME}"
#: Characters of each statement kept for ``--trace`` (``--trace-width``).
TRACE_WIDTH = 160


@dataclass
class Call:
    """The store work of one activity execution (all its attempts)."""

    statements: int = 0
    rows: int = 0  # rows returned by SELECTs, the context read excluded
    context_rows: int = 0
    context_statements: int = 0
    sql: list[str] = field(default_factory=list[str])  # the statements, for --trace


@dataclass
class Counter:
    """Statements per activity execution, keyed ``(activity type, workflow id, activity id)``, in start order."""

    calls: dict[tuple[str, str, str], Call] = field(default_factory=dict[tuple[str, str, str], Call])
    other: Call = field(default_factory=Call)
    trace_width: int = TRACE_WIDTH  # characters of each statement kept in ``Call.sql``

    def current(self) -> Call:
        try:
            info = activity.info()
        except RuntimeError:
            return self.other
        key = (info.activity_type, info.workflow_id or "", info.activity_id)
        return self.calls.setdefault(key, Call())

    def of(self, activity_type: str) -> list[Call]:
        return [call for (kind, _, _), call in self.calls.items() if kind == activity_type]


def _is_context_read(statement: str) -> bool:
    """The request-building read: the messages of a turn's frozen context (``sequence <=`` its context sequence)."""
    text = " ".join(statement.split()).lower()
    return text.startswith("select") and "from turnkit_messages" in text and "turnkit_messages.sequence <=" in text


def instrument(store: Store, counter: Counter) -> None:
    """Count every statement the store's engine runs (see the module docstring)."""
    engine = store.engine.sync_engine

    @event.listens_for(engine, "after_cursor_execute")
    def _after(_conn: Any, cursor: Any, statement: str, _params: Any, _context: Any, _many: bool) -> None:
        if "pg_notify(" in statement:
            return  # the live transport's (turnkit/store/live.py), sent only while someone watches: not store work
        call = counter.current()
        call.statements += 1
        call.sql.append(" ".join(statement.split())[: counter.trace_width])
        if not statement.lstrip().lower().startswith("select"):
            return
        rows = getattr(cursor, "_rows", None)
        read = len(rows) if rows is not None else max(int(getattr(cursor, "rowcount", 0) or 0), 0)
        if _is_context_read(statement):
            call.context_statements += 1
            call.context_rows += read
        else:
            call.rows += read


@dataclass
class Figures:
    """Per-call figures of one activity type in one K-iteration turn."""

    calls: int
    statements: float
    rows: float
    context_rows: float
    last_statements: int
    last_rows: int
    last_context_rows: int


def figures(calls: list[Call]) -> Figures:
    last = calls[-1]
    return Figures(
        calls=len(calls),
        statements=statistics.mean(c.statements for c in calls),
        rows=statistics.mean(c.rows for c in calls),
        context_rows=statistics.mean(c.context_rows for c in calls),
        last_statements=last.statements,
        last_rows=last.rows,
        last_context_rows=last.context_rows,
    )


@asynccontextmanager
async def postgres_database(url: str) -> AsyncGenerator[str]:
    """A fresh database on the server of ``url``, dropped on exit."""
    import asyncpg  # pyright: ignore[reportMissingTypeStubs]

    base = make_url(url)
    name = f"turnkit_bench_store_work_{uuid.uuid4().hex[:10]}"
    dsn = base.set(drivername="postgresql").render_as_string(hide_password=False)
    admin = await asyncpg.connect(dsn)  # pyright: ignore[reportUnknownMemberType]
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield base.set(database=name).render_as_string(hide_password=False)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def measure(
    address: str, database_url: str, trace: bool = False, trace_width: int = TRACE_WIDTH
) -> dict[int, dict[str, Figures]]:
    """K -> activity type -> figures, one K-iteration turn each (after one warm-up turn)."""
    # Rows are counted from the driver adapter's buffered cursor (aiosqlite's, asyncpg's): on SQLite, keep the store's
    # statements on aiosqlite (the statements are the same as on the inline path, turnkit/store/sqlite_inline.py).
    store = await Store.open(database_url, sqlite_inline=False)
    counter = Counter(trace_width=trace_width)
    instrument(store, counter)
    results: dict[int, dict[str, Figures]] = {}
    try:
        client = await Client.connect(address, plugins=[TurnKitPlugin(store)])
        tk = TurnKit(client, store, task_queue=f"bench-store-work-{uuid.uuid4().hex[:8]}")
        async with tk.worker():
            for k in (1, *ITERATIONS):  # K = 1 warms up the worker, caches and connections
                counter.calls.clear()
                conversation = await tk.conversation(AGENT)
                turn = await conversation.ask(workload.prompt(k))
                if turn.status != "completed":
                    raise RuntimeError(f"K={k}: turn {turn.id} ended {turn.status}: {turn.error}")
                workload.check(k, turn.output_text)
                if k in ITERATIONS:
                    model, tool = counter.of(MODEL), counter.of(TOOL)
                    if len(model) != k + 1 or len(tool) != k:
                        raise RuntimeError(f"K={k}: {len(model)} model calls, {len(tool)} tool calls")
                    results[k] = {MODEL: figures(model), TOOL: figures(tool)}
                    if trace and k == ITERATIONS[0]:
                        for label, calls in (("model call", model), ("tool call", tool)):
                            print(f"-- the last {label} of K={k}:", *calls[-1].sql, sep="\n  ", file=sys.stderr)
    finally:
        await store.close()
    return results


def report(by_store: dict[str, dict[int, dict[str, Figures]]]) -> None:
    print(
        f"TurnKit store work per call · {dt.date.today().isoformat()} · {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} cores · Python {platform.python_version()}"
    )
    print("mean over the turn's calls / the last call; rows = rows read by SELECTs other than the context read")
    print()
    header = (
        f"{'store':<12}{'K':>4}  {'call':<14}{'statements':>12}{'rows read':>12}{'context rows':>14}"
        f"{'last: stmts':>13}{'rows':>6}{'context':>9}"
    )
    print(header)
    print("-" * len(header))
    for name, results in by_store.items():
        for k, per_type in results.items():
            for label, kind in (("per model call", MODEL), ("per tool call", TOOL)):
                f = per_type[kind]
                print(
                    f"{name:<12}{k:>4}  {label:<14}{f.statements:>12.1f}{f.rows:>12.1f}{f.context_rows:>14.1f}"
                    f"{f.last_statements:>13}{f.last_rows:>6}{f.last_context_rows:>9}"
                )
        print()


@asynccontextmanager
async def turnkit_dev_server() -> AsyncGenerator[str]:
    """A dev server of its own with TurnKit's search attributes (its log silent); its address."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        plugins=[TurnKitPlugin()],
        dev_server_log_level="never",
        search_attributes=ALL_SEARCH_ATTRIBUTES,
    )
    try:
        yield env.client.service_client.config.target_host
    finally:
        await env.shutdown()


async def main(args: argparse.Namespace) -> None:
    async with turnkit_dev_server() as address:
        by_store: dict[str, dict[int, dict[str, Figures]]] = defaultdict(dict)
        with tempfile.TemporaryDirectory(prefix="turnkit-bench-store-work-") as tmp:
            print("  sqlite …", file=sys.stderr, flush=True)
            url = f"sqlite+aiosqlite:///{Path(tmp) / 'store.db'}"
            by_store["sqlite"] = await measure(address, url, args.trace, args.trace_width)
        postgres = os.environ.get("TURNKIT_BENCH_POSTGRES_URL")
        if postgres:
            print("  postgresql …", file=sys.stderr, flush=True)
            async with postgres_database(postgres) as url:
                by_store["postgresql"] = await measure(address, url, args.trace, args.trace_width)
        report(by_store)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", action="store_true", help="print the statements of the last calls of K=2")
    parser.add_argument("--trace-width", type=int, default=TRACE_WIDTH, help="characters of each traced statement")
    asyncio.run(main(parser.parse_args()))
    exit_process()  # the Temporal client's native threads can abort a finalizing interpreter (_temporal/process.py)
