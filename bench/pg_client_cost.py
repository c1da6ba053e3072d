"""The process's CPU per PostgreSQL store transaction, against raw asyncpg: ``python -m bench.pg_client_cost``.

Needs ``TURNKIT_BENCH_POSTGRES_URL`` (e.g. ``postgresql+asyncpg://postgres@127.0.0.1:5432/postgres``); a scratch
database is created in it and dropped afterwards.

One connection's worth of work, back to back on one event loop, so that the process's CPU per operation is what the
client side costs (the server's is ``bench.pg_server_cost``'s). Each row is the median of ``--rounds`` rounds of
``--n`` operations, the kinds interleaved round by round:

- **store transaction**: ``Store.atomic(conversation_id=…)`` with nothing inside: BEGIN, the conversation's lock,
  COMMIT, on the store's pool and its direct path (``turnkit/store/postgres_direct.py``);
- **store transaction with no statement**: ``Store.atomic()`` alone, which sends nothing (its bookkeeping, and
  the connection taken and kept again: ``turnkit/store/kept_connections.py``);
- **raw asyncpg, pooled**: the same three statements on an asyncpg pool's connection (``Pool.acquire``, whose
  release runs asyncpg's reset query: one more round trip);
- **raw asyncpg, held**: the same three on one connection held throughout (no pool);
- **raw asyncpg, held, the lock alone**: its statement alone, outside BEGIN, so the server commits it as it ends: one
  round trip, what a transaction written as one statement would cost the process (the difference from the row above
  is what its BEGIN and COMMIT cost);
- **SQLAlchemy checkout + return** and **its raw connection**: what a checkout from the store's pool costs alone (a
  transaction paid the first before its connections were kept).

What it answers: how much of TurnKit's client-side CPU per PostgreSQL transaction is its own (above asyncpg's) and
how much is the round trips themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable

import asyncpg
from sqlalchemy.engine import make_url

from bench.store_work import postgres_database
from turnkit.store import Store

Operation = Callable[[], Awaitable[object]]


async def _time(operation: Operation, n: int) -> float:
    """The process's CPU per call of ``operation`` over ``n`` calls, in µs."""
    started = time.process_time()
    for _ in range(n):
        await operation()
    return (time.process_time() - started) / n * 1e6


async def measure(url: str, n: int, rounds: int) -> dict[str, list[float]]:
    """Each operation's µs of CPU per call, one figure per round."""
    store = await Store.open(url)
    raw_url = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    pool = await asyncpg.create_pool(raw_url, min_size=1, max_size=1)
    held = await asyncpg.connect(raw_url)
    try:
        conversation = (await store.create_conversation(agent_name="bench")).id
        lock = "SELECT id FROM turnkit_conversations WHERE uid = $1 FOR UPDATE"
        engine = store.engine

        async def store_transaction() -> None:
            async with store.atomic(conversation_id=conversation):
                pass

        async def empty_transaction() -> None:
            async with store.atomic():  # no statement: no BEGIN, no COMMIT is sent
                pass

        async def raw_pooled() -> None:
            async with pool.acquire() as connection:
                await connection.execute("BEGIN")
                await connection.fetchrow(lock, conversation)
                await connection.execute("COMMIT")

        async def raw_held() -> None:
            await held.execute("BEGIN")
            await held.fetchrow(lock, conversation)
            await held.execute("COMMIT")

        async def raw_statement() -> None:
            await held.fetchrow(lock, conversation)  # outside BEGIN: its own transaction, committed by the server

        async def checkout() -> None:
            async with engine.connect():
                pass

        async def raw_checkout() -> None:
            connection = await engine.raw_connection()
            connection.close()  # back to the pool: nothing to roll back, so nothing awaits the driver

        operations: dict[str, Operation] = {
            "store transaction (BEGIN, lock, COMMIT)": store_transaction,
            "store transaction with no statement": empty_transaction,
            "raw asyncpg, pooled (+ its reset query)": raw_pooled,
            "raw asyncpg, one connection held": raw_held,
            "raw asyncpg, held, the lock alone (autocommit)": raw_statement,
            "SQLAlchemy connect + close (no statement)": checkout,
            "SQLAlchemy raw_connection + close": raw_checkout,
        }
        for operation in operations.values():  # warm: prepared statements, pools, caches
            for _ in range(max(n // 10, 10)):
                await operation()
        figures: dict[str, list[float]] = {name: [] for name in operations}
        for _ in range(rounds):
            for name, operation in operations.items():
                figures[name].append(await _time(operation, n))
        return figures
    finally:
        await held.close()
        await pool.close()
        await store.close()


async def _run(admin_url: str, n: int, rounds: int) -> None:
    async with postgres_database(admin_url) as url:
        figures = await measure(url, n, rounds)
    print(f"process CPU per operation, µs (median of {rounds} rounds of {n}; rounds in brackets)")
    for name, values in figures.items():
        rounds_text = ", ".join(f"{value:.0f}" for value in values)
        print(f"  {name:<45}{statistics.median(values):>8.1f}   [{rounds_text}]")


def main() -> None:
    """``python -m bench.pg_client_cost``: the table above, printed."""
    parser = argparse.ArgumentParser(description="process CPU per PostgreSQL store transaction, against asyncpg")
    parser.add_argument("--n", type=int, default=2000, help="operations per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the kinds interleaved (default 3)")
    args = parser.parse_args()
    url = os.environ.get("TURNKIT_BENCH_POSTGRES_URL")
    if not url:
        sys.exit("set TURNKIT_BENCH_POSTGRES_URL")
    asyncio.run(_run(url, args.n, args.rounds))


if __name__ == "__main__":
    main()
