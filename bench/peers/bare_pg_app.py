"""The workload on bare Temporal with the least record in PostgreSQL: a second floor, not a peer.

The same workflow and activities as :mod:`bench.peers.bare_app`, and each ``model`` and ``lookup`` attempt also
records its step in PostgreSQL the cheapest way a durable record can be had there: one small row (the turn's
workflow id, the step, its kind, a short JSON payload, ``created_at``) in one ``INSERT ... ON CONFLICT DO NOTHING``
in autocommit, through asyncpg with no ORM, on a pool of TurnKit's store's size. One round trip and one commit per
step: what any runtime that keeps a record of each model and tool step in PostgreSQL pays at the least, on the same
2 cores as the dev server and the database server (TurnKit runs ~4 transactions per iteration). ``ON CONFLICT DO
NOTHING`` on (workflow id, step) keeps the write idempotent, as every store write has to be: a retried attempt of a
step records nothing new.

The table, :data:`TABLE`, is created in the database of the URL the driver passes (``--postgres-url``) when the
system opens, and emptied then, so that each run starts from an empty table and its rows can be counted after it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from typing import Any

import asyncpg
from temporalio import activity

from bench.peers import bare_app, workload

TABLE = "bench_floor_step"

#: TurnKit's store pool (``turnkit/store/engine.py``): ``POOL_SIZE`` connections kept open, up to ``MAX_OVERFLOW``
#: more for a moment, from the same environment variables. Copied, not imported, so that this process holds no
#: TurnKit module (``tests/test_bench_peers.py`` checks they agree).
POOL_SIZE = 20
MAX_OVERFLOW = 10

_CREATE = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    workflow_id text NOT NULL,
    step integer NOT NULL,
    kind text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (workflow_id, step)
)
"""
_INSERT = f"INSERT INTO {TABLE} (workflow_id, step, kind, payload) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"


def _pool_setting(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value else default


def libpq_url(url: str) -> str:
    """``url`` as asyncpg takes it: a SQLAlchemy URL's driver (``postgresql+asyncpg://``) dropped."""
    return re.sub(r"^postgres(?:ql)?\+\w+://", "postgresql://", url)


class System(bare_app.System):
    """Bare Temporal with one PostgreSQL row per activity attempt, for :mod:`bench.peers.serve`."""

    name = "bare-pg"

    def __init__(self, database_url: str | None = None) -> None:
        if not database_url or not database_url.startswith("postgres"):
            raise ValueError(f"bare_pg records in PostgreSQL: give its URL with --database-url (got {database_url!r})")
        super().__init__()
        self.dsn = libpq_url(database_url)
        self._pool: asyncpg.Pool | None = None

    def activities(self) -> list[Callable[..., Any]]:
        return [self.model, self.lookup]

    async def open(self, address: str) -> None:
        size = _pool_setting("TURNKIT_DB_POOL_SIZE", POOL_SIZE)
        overflow = _pool_setting("TURNKIT_DB_MAX_OVERFLOW", MAX_OVERFLOW)
        # Opened as needed, as TurnKit's pool is (SQLAlchemy opens a connection when none is free): a pool that
        # opened all of its connections at once would hold 20 while the TurnKit columns' processes hold theirs, past
        # PostgreSQL's default max_connections of 100 with four of them.
        self._pool = await asyncpg.create_pool(self.dsn, min_size=0, max_size=size + overflow)
        async with self._pool.acquire() as connection:
            await self._create_tables(connection)
        await super().open(address)

    async def _create_tables(self, connection: asyncpg.pool.PoolConnectionProxy) -> None:
        """The record's table, created if missing and emptied (each run's rows can be counted after it)."""
        await connection.execute(_CREATE)
        await connection.execute(f"TRUNCATE {TABLE}")

    async def _record(self, kind: str, payload: dict[str, Any]) -> None:
        """The step's row: one statement in autocommit, one round trip, one commit."""
        assert self._pool is not None
        info = activity.info()
        await self._pool.execute(_INSERT, info.workflow_id, int(info.activity_id), kind, json.dumps(payload))

    @activity.defn(name="model")
    async def model(self, call: bare_app.ModelCall) -> bare_app.ModelAnswer:
        """The scripted model of :func:`bench.peers.bare_app.model`, and its answer recorded."""
        answer = await bare_app.model(call)
        await self._record("model", {"query": answer.query} if answer.query is not None else {"text": answer.text})
        return answer

    @activity.defn(name=workload.TOOL_NAME)
    async def lookup(self, q: str) -> str:
        """The tool of :func:`bench.peers.bare_app.lookup`, and its result recorded."""
        result = await bare_app.lookup(q)
        await self._record("lookup", {"q": q, "result": result})
        return result

    async def close(self) -> None:
        try:
            await super().close()
        finally:
            if self._pool is not None:
                await self._pool.close()
