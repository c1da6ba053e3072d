"""The SQLAlchemy engine a store runs on: its URL's backend, its pool, and SQLite's connection settings."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Final

from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from turnkit.store.idle_ping import ping_when_idle
from turnkit.store.sqlite_trips import OneTripConnection, use_one_trip_cursors
from turnkit.store.storable import json_text, stored_json, written_json

_log = logging.getLogger(__name__)

__all__ = [
    "MAX_OVERFLOW",
    "PLAN_CACHE_MODE",
    "POOL_SIZE",
    "sqlite_file",
    "store_engine",
]

#: PostgreSQL connections a store's pool keeps open (``TURNKIT_DB_POOL_SIZE``), and how many more it may open for a
#: moment (``TURNKIT_DB_MAX_OVERFLOW``). SQLAlchemy's defaults (5 and 10) fit a web request's handler, not a worker
#: whose activities run dozens of store transactions at once: a connection beyond the pool's size is closed when it
#: is returned, so a burst of 40 turns in one process opened and closed 34 connections (10 with these sizes), each
#: an asyncpg connect of several round trips, its type introspection, and a PostgreSQL backend started and stopped.
POOL_SIZE: Final = 20
MAX_OVERFLOW: Final = 10
#: How PostgreSQL plans the store's prepared statements on each connection (``TURNKIT_DB_PLAN_CACHE_MODE``; empty:
#: leave the server's own setting). PostgreSQL's ``auto`` plans a prepared statement anew for each of its first five
#: executions on a connection before it compares them with a generic plan, so every new connection pays five custom
#: plans per statement: a turn's lock+look costs 200-430 µs of server CPU custom-planned and 85-160 µs generic. A
#: worker's bursts open connections beyond the pool's size and close them when they come back, and a burst of turns
#: spread over 20-30 connections runs each statement only a few times on each: most executions were custom-planned.
#: The store's statements look rows up by key through plain btree indexes (no partial index, no value whose
#: selectivity would change the plan), so the generic plan is the plan a custom one picks.
PLAN_CACHE_MODE: Final = "force_generic_plan"
_PLAN_CACHE_MODES: Final = ("auto", "force_generic_plan", "force_custom_plan")


def sqlite_file(url: str, *, plain: bool = True) -> str | None:
    """The database file of a ``sqlite`` URL, else None (not SQLite, in memory; with ``plain``, a URL with a query
    string, whose options only aiosqlite's engine takes)."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" or (plain and parsed.query):
        return None
    return database


def store_engine(url: str, *, echo: bool) -> AsyncEngine:
    """The engine of a store at ``url``: SQLite with WAL and BEGIN IMMEDIATE, else a bounded pool kept alive."""
    if url.startswith("sqlite"):
        path = sqlite_file(url, plain=False)
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # SQLite keeps a JSON column's text as the store wrote it, keys sorted: decoded without sorting them again.
        engine = create_async_engine(
            url,
            echo=echo,
            connect_args={"timeout": 60},
            json_serializer=json_text,
            json_deserializer=written_json,
        )
        use_one_trip_cursors(engine)
        _configure_sqlite(engine)
        return engine
    # A bounded connect (asyncpg's default is 60 s): during an outage an attempt fails fast and is retried, well
    # inside a store activity's start-to-close timeout (issue 8).
    connect_args = {"timeout": 10} if "+asyncpg" in url else {}
    plan_cache_mode = _plan_cache_mode(url)
    engine = create_async_engine(
        url,
        echo=echo,
        connect_args=connect_args,
        json_deserializer=stored_json,  # asyncpg's json and jsonb codecs decode with it
        pool_size=_pool_setting("TURNKIT_DB_POOL_SIZE", POOL_SIZE),
        max_overflow=_pool_setting("TURNKIT_DB_MAX_OVERFLOW", MAX_OVERFLOW),
    )
    ping_when_idle(engine)  # not pool_pre_ping: three round trips on every checkout (turnkit/store/idle_ping.py)
    if plan_cache_mode is not None:
        _plan_on_connect(engine, plan_cache_mode)
    return engine


def _plan_on_connect(engine: AsyncEngine, mode: str) -> None:
    """Set ``plan_cache_mode`` on each new connection of ``engine``, once, before the pool hands it out.

    A ``SET`` on connecting (one round trip per connection), not a startup parameter: PgBouncer refuses startup
    parameters it was not told to ignore, and would refuse every connection. A server that does not know the
    setting (PostgreSQL before 12) keeps its own planning, said once in the log, and the connection is used as it is.
    """
    warned = False
    statement = f"SET plan_cache_mode = {mode}"  # one of _PLAN_CACHE_MODES: no quoting needed

    def set_mode(driver: Any) -> Awaitable[Any]:
        return driver.execute(statement)

    @event.listens_for(engine.sync_engine, "connect")
    def _set_plan_cache_mode(dbapi_connection: Any, _record: Any) -> None:
        nonlocal warned
        try:
            # Outside any transaction: the setting is the session's, and survives every COMMIT and ROLLBACK.
            dbapi_connection.run_async(set_mode)
        except Exception as error:  # the server's own error (asyncpg's); a lost connection fails its first statement
            if not warned:
                warned = True
                _log.warning(
                    "PostgreSQL kept its own plan_cache_mode (SET plan_cache_mode = %s failed: %s)", mode, error
                )


def _pool_setting(name: str, default: int) -> int:
    """A PostgreSQL pool setting from the environment variable ``name``, else ``default``."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ValueError(f"{name} must be a whole number of connections, 0 or more (got {value!r})")
    return number


def _plan_cache_mode(url: str) -> str | None:
    """The ``plan_cache_mode`` the store's asyncpg connections are set to, or None to leave the server's: not asyncpg,
    set empty in ``TURNKIT_DB_PLAN_CACHE_MODE``, or prepared statements turned off (``prepared_statement_cache_size=0``,
    as behind PgBouncer in transaction mode, where no plan is kept and a session's ``SET`` would reach other
    clients)."""
    value = os.environ.get("TURNKIT_DB_PLAN_CACHE_MODE")
    mode = PLAN_CACHE_MODE if value is None else value.strip()
    if mode and mode not in _PLAN_CACHE_MODES:
        raise ValueError(
            f"TURNKIT_DB_PLAN_CACHE_MODE must be one of {', '.join(_PLAN_CACHE_MODES)} or empty (got {value!r})"
        )
    parsed = make_url(url)
    if not mode or parsed.get_driver_name() != "asyncpg" or parsed.query.get("prepared_statement_cache_size") == "0":
        return None
    return mode


def _configure_sqlite(engine: AsyncEngine) -> None:
    """WAL, a generous busy timeout, and BEGIN IMMEDIATE so that a transaction takes the write lock up front.

    With the default deferred BEGIN, two transactions that read then write deadlock-upgrade (SQLITE_BUSY); taking
    the lock first makes concurrent appends queue up instead, which is what gives gap-free sequences.
    """

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # let the "begin" hook below emit BEGIN itself
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")  # "memory" for an in-memory database, or what a file system allows
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(conn: Connection) -> None:
        driver = conn.connection.driver_connection  # the aiosqlite connection under SQLAlchemy's adapter
        if isinstance(driver, OneTripConnection):
            driver.begin_with_next_statement("BEGIN IMMEDIATE")  # one trip with the first statement
        else:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
