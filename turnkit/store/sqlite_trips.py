"""aiosqlite with one trip to the connection's thread per statement instead of four (CPU per turn, issue 9).

aiosqlite runs every sqlite3 call on a thread of its own, and SQLAlchemy's adapter makes four calls per statement:
create a cursor, execute, fetch all rows, close the cursor. Each is a queue hand-off to that thread and a wake-up
of the event loop when it answers, which costs more CPU than the statement itself. :class:`OneTripConnection`
makes its cursors do the four in one call (``execute`` also fetches every row and closes the sqlite3 cursor, then
answers ``description``, ``rowcount``, ``lastrowid`` and the fetches from what it kept). The SQL, its parameters,
the order of statements on the connection and the transactions are unchanged; only the number of hand-offs is.

SQLAlchemy's adapter reads whole results anyway (its non-streaming cursor calls ``fetchall`` after each statement),
so fetching them in the same call changes no behaviour. :func:`use_one_trip_cursors` installs it on an engine.

A transaction's own trips are cut the same way. Its ``BEGIN IMMEDIATE`` (``store.py``'s begin hook) travels with
its first statement (:meth:`OneTripConnection.begin_with_next_statement`), and the rollback that SQLAlchemy's pool
sends every connection it takes back, also after a commit, costs no trip when sqlite3 said, at the end of the last
trip, that no transaction is open (its ``rollback`` would do nothing then). A store transaction of one read went
from four trips (BEGIN, the read, COMMIT, the pool's ROLLBACK) to two.

A store transaction on a SQLite file in WAL mode makes no trip at all: it runs on SQLAlchemy's synchronous engine on
the event loop's thread (``turnkit/store/sqlite_inline.py``). This engine serves the rest: the migrations, an
in-memory database, a file system that refuses WAL, and ``Store.open(url, sqlite_inline=False)``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, cast

import aiosqlite
from aiosqlite import context as aiosqlite_context
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["OneTripConnection", "OneTripCursor", "use_one_trip_cursors"]

#: What one trip answers: description, rowcount, lastrowid, rows.
_Outcome = tuple[Any, int, int | None, list[Any]]


def _run(
    connection: sqlite3.Connection, begin: str | None, sql: str, parameters: Any, many: bool, row_factory: Any
) -> _Outcome:
    """On the connection's thread: ``begin`` (the transaction's BEGIN, when this is its first statement), then the
    statement, its rows, and what the cursor said, with the cursor closed."""
    if begin is not None:
        connection.execute(begin).close()
    cursor = connection.cursor()
    try:
        if row_factory is not None:
            cursor.row_factory = row_factory
        if many:
            cursor.executemany(sql, parameters)
        else:
            cursor.execute(sql, parameters)
        description = cursor.description
        rows = cursor.fetchall() if description is not None else []
        return description, cursor.rowcount, cursor.lastrowid, rows
    finally:
        cursor.close()


class OneTripCursor(aiosqlite.Cursor):
    """An aiosqlite cursor whose ``execute`` is one trip to the connection's thread (see the module docstring).

    Its rows are buffered: the fetches read the buffer, and ``close`` has nothing left to close on the thread.
    """

    def __init__(self, conn: aiosqlite.Connection) -> None:
        # No sqlite3 cursor here: sqlite3 objects belong to the connection's thread, where _run makes one.
        super().__init__(conn, None)  # type: ignore[arg-type]
        self._outcome: _Outcome = (None, -1, None, [])
        self._next = 0
        self._arraysize = 1
        self._row_factory: Any = None

    async def execute(self, sql: str, parameters: Iterable[Any] | None = None) -> OneTripCursor:
        """Execute ``sql`` and fetch its rows, in one trip."""
        await self._trip(sql, [] if parameters is None else parameters, many=False)
        return self

    async def executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> OneTripCursor:
        """Execute ``sql`` once per parameter set, in one trip."""
        await self._trip(sql, parameters, many=True)
        return self

    async def executescript(self, sql_script: str) -> OneTripCursor:
        """Run a script (a trip of its own; no rows)."""
        await self._one_trip_connection.send(_script, sql_script)
        self._outcome, self._next = (None, -1, None, []), 0
        return self

    @property
    def _one_trip_connection(self) -> OneTripConnection:
        return cast(OneTripConnection, self._conn)

    async def _trip(self, sql: str, parameters: Any, *, many: bool) -> None:
        self._outcome = await self._one_trip_connection.send(_run, sql, parameters, many, self._row_factory)
        self._next = 0

    async def fetchone(self) -> Any:
        rows = self._outcome[3]
        if self._next >= len(rows):
            return None
        self._next += 1
        return rows[self._next - 1]

    async def fetchmany(self, size: int | None = None) -> Sequence[Any]:
        count = self._arraysize if size is None else size
        rows = self._outcome[3][self._next : self._next + count]
        self._next += len(rows)
        return rows

    async def fetchall(self) -> Sequence[Any]:
        rows = self._outcome[3][self._next :]
        self._next = len(self._outcome[3])
        return rows

    async def close(self) -> None:
        """Nothing to close on the thread (``execute`` closed the sqlite3 cursor); the buffer is dropped."""
        self._outcome, self._next = (None, -1, None, []), 0

    @property
    def description(self) -> Any:
        return self._outcome[0]

    @property
    def rowcount(self) -> int:
        return self._outcome[1]

    @property
    def lastrowid(self) -> int | None:
        return self._outcome[2]

    @property
    def arraysize(self) -> int:
        return self._arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._arraysize = value

    @property
    def row_factory(self) -> Any:
        return self._row_factory

    @row_factory.setter
    def row_factory(self, factory: Any) -> None:
        self._row_factory = factory  # applied to the sqlite3 cursor of the next statement

    @property
    def connection(self) -> sqlite3.Connection:
        return self._conn._conn  # pyright: ignore[reportPrivateUsage]


def _script(connection: sqlite3.Connection, begin: str | None, sql_script: str) -> None:
    if begin is not None:
        connection.execute(begin).close()
    connection.executescript(sql_script)


def _in_transaction(connection: sqlite3.Connection | None) -> bool:
    """On the connection's thread: whether a transaction is open (False once the connection is closed)."""
    try:
        return connection is not None and connection.in_transaction
    except sqlite3.ProgrammingError:  # closed
        return False


class OneTripConnection(aiosqlite.Connection):
    """An aiosqlite connection whose cursors are :class:`OneTripCursor` (made without a trip), whose BEGIN travels
    with the transaction's first statement, and whose rollback outside a transaction makes no trip."""

    def __init__(self, connector: Callable[[], sqlite3.Connection], iter_chunk_size: int) -> None:
        super().__init__(connector, iter_chunk_size)
        #: The BEGIN to send before the next statement (set by the engine's begin hook, taken by the next trip).
        self._begin: str | None = None
        #: Whether sqlite3 had a transaction open at the end of the last trip (read on the connection's thread).
        self._open = False
        #: Trips queued (counted on the event loop) and the last one finished (set on the connection's thread): while
        #: one is still running, ``_open`` is not yet known. A cancelled ``await`` leaves its statement running there.
        self._queued = 0
        self._finished = 0

    def begin_with_next_statement(self, begin: str) -> None:
        """Send ``begin`` (``BEGIN IMMEDIATE``) in the same trip as the next statement instead of in one of its own.

        Nothing else runs on this connection in between: SQLAlchemy's transaction goes on with a statement, or ends
        (then the BEGIN is dropped: a commit or rollback of a transaction that never started does nothing)."""
        self._begin = begin

    def take_begin(self) -> str | None:
        """The BEGIN waiting for the next statement, if any (it is sent with that statement, or not at all)."""
        begin, self._begin = self._begin, None
        return begin

    async def send(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(sqlite3_connection, begin, *args)`` in one trip, with the waiting BEGIN (if any)."""
        return await self._execute(fn, self._conn, self.take_begin(), *args)

    async def _execute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """aiosqlite's one funnel to the connection: a trip to its thread, noting there whether a transaction is open
        after."""
        self._queued += 1
        trip = self._queued

        def call() -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                self._open = _in_transaction(self._connection)
                self._finished = trip  # after _open: seeing this trip finished means seeing its _open

        return await super()._execute(call)

    def _surely_idle(self) -> bool:
        """No transaction is open: every queued trip has finished, and sqlite3 said so at the end of the last."""
        return self._finished == self._queued and not self._open

    async def commit(self) -> None:
        """Commit, unless the transaction never sent a statement (nothing to commit: no trip)."""
        if self.take_begin() is not None and self._surely_idle():
            return
        await super().commit()

    async def rollback(self) -> None:
        """Roll back; no trip when no transaction is open (sqlite3's rollback would do nothing). SQLAlchemy's pool
        rolls back every connection it takes back, also right after a commit. A trip still running (its ``await``
        was cancelled) may yet open one: then the rollback is queued behind it, as before."""
        self.take_begin()
        if self._surely_idle():
            return
        await super().rollback()

    @aiosqlite_context.contextmanager  # awaitable and an async context manager, as aiosqlite's own cursor()
    async def cursor(self) -> OneTripCursor:  # pyright: ignore[reportIncompatibleMethodOverride]
        return OneTripCursor(self)


def _connect(database: str, **kwargs: Any) -> OneTripConnection:
    """What ``aiosqlite.connect`` does, with a :class:`OneTripConnection` (SQLAlchemy awaits it)."""
    connection = OneTripConnection(partial(sqlite3.connect, database, **kwargs), 64)
    connection._thread.daemon = True  # pyright: ignore[reportPrivateUsage]  # as SQLAlchemy does for aiosqlite's
    return connection


def use_one_trip_cursors(engine: AsyncEngine) -> None:
    """Make ``engine`` (``sqlite+aiosqlite``) open :class:`OneTripConnection`\\ s, with the URL's own connect
    arguments (the database, ``timeout``, ``uri``...)."""

    @event.listens_for(engine.sync_engine, "do_connect")
    def _one_trip(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        # The adapter calls it with the connect arguments and awaits it.
        cparams["async_creator_fn"] = _connect
