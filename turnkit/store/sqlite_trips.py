"""SQLite statements off the event loop, one trip to a thread per statement instead of four (CPU per turn, issue 9).

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

**Only aiosqlite's public API** (issue 37). aiosqlite offers no public way to run a function of one's own on its
thread, so the trips go to a thread of TurnKit's own (:class:`Trips`, one per connection, a daemon): every statement,
commit and rollback of the connection runs there, one at a time, in the order sent, on the ``sqlite3`` connection
that the connector given to aiosqlite opened (``check_same_thread=False``: aiosqlite's thread opens it). A
:class:`OneTripConnection` is still an ``aiosqlite.Connection``, which is what SQLAlchemy's aiosqlite dialect takes
(``async_creator_fn``): aiosqlite's own thread opens and finally closes the connection, and answers what SQLAlchemy
asks of it at connect time (its isolation level, its SQL functions), never while a trip runs. The connection is made
on TurnKit's thread, so that aiosqlite's thread, made with it, is a daemon too (a thread inherits that from the thread
that creates it), as SQLAlchemy makes it for the connections it opens itself: an engine left undisposed never holds up
the interpreter's exit.

A store transaction on a SQLite file in WAL mode makes no trip at all: it runs on SQLAlchemy's synchronous engine on
the event loop's thread (``turnkit/store/sqlite_inline.py``). This engine serves the rest: the migrations, an
in-memory database, a file system that refuses WAL, and ``Store.open(url, sqlite_inline=False)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Sequence
from queue import SimpleQueue
from typing import Any

import aiosqlite
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["OneTripConnection", "OneTripCursor", "Trips", "use_one_trip_cursors"]

#: What one trip answers: description, rowcount, lastrowid, rows.
_Outcome = tuple[Any, int, int | None, list[Any]]
_NO_OUTCOME: _Outcome = (None, -1, None, [])
#: One call queued for the thread: where to answer it, its trip number, the function and its arguments.
_Call = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], int, Callable[..., Any], tuple[Any, ...]]


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


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """On the event loop: the answer of a trip (unless its ``await`` was cancelled meanwhile)."""
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class Trips:
    """The thread of one SQLite connection (a daemon of TurnKit's own) and what it knows of the connection's
    transaction: every statement, commit and rollback is a trip to it, run one at a time in the order sent."""

    def __init__(self, database: str, connect_args: dict[str, Any]) -> None:
        self._database = database
        self._connect_args: dict[str, Any] = {**connect_args, "check_same_thread": False}  # used on this thread
        #: The ``sqlite3`` connection (set by :meth:`connector` when aiosqlite opens it).
        self.sqlite: sqlite3.Connection | None = None
        #: The BEGIN to send before the next statement (set by the engine's begin hook, taken by the next trip).
        self.begin: str | None = None
        #: Whether sqlite3 had a transaction open at the end of the last trip (set on the thread).
        self.open = False
        #: Trips queued (counted on the event loop) and the last one finished (set on the thread): while one is still
        #: running, ``open`` is not yet known. A cancelled ``await`` leaves its statement running there.
        self.queued = 0
        self.finished = 0
        self.stopped = False
        self._calls: SimpleQueue[_Call | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="turnkit-sqlite-trips", daemon=True)
        self._thread.start()

    def connector(self) -> sqlite3.Connection:
        """Open the ``sqlite3`` connection (aiosqlite calls it, on its thread)."""
        connection = self.sqlite = sqlite3.connect(self._database, **self._connect_args)
        return connection

    def take_begin(self) -> str | None:
        """The BEGIN waiting for the next statement, if any (it is sent with that statement, or not at all)."""
        begin, self.begin = self.begin, None
        return begin

    def surely_idle(self) -> bool:
        """No transaction is open: every queued trip has finished, and sqlite3 said so at the end of the last."""
        return self.finished == self.queued and not self.open

    async def send(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(sqlite3_connection, begin, *args)`` in one trip, with the waiting BEGIN (if any)."""
        return await self.run(fn, self.sqlite, self.take_begin(), *args)

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One trip: ``fn(*args)`` on the thread, after the trips before it; there, after it, whether a transaction is
        open."""
        if self.stopped or self.sqlite is None:
            raise ValueError("Connection closed")  # what aiosqlite says (SQLAlchemy's dialect knows it: a disconnect)
        self.queued += 1
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.put((loop, future, self.queued, fn, args))
        return await future

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the thread, no trip of the connection's (before it is open)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.put((loop, future, 0, fn, args))
        return await future

    def stop(self) -> None:
        """Let the thread end once the trips queued so far have run."""
        if not self.stopped:
            self.stopped = True
            self._calls.put(None)

    def close_sqlite(self) -> None:
        """On the thread: close the ``sqlite3`` connection."""
        if self.sqlite is not None:
            self.sqlite.close()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            loop, future, trip, fn, args = call
            try:
                ok, value = True, fn(*args)
            except BaseException as error:  # answered on the event loop
                ok, value = False, error
            if trip:
                self.open = _in_transaction(self.sqlite)
                self.finished = trip  # after open: seeing this trip finished means seeing its open
            with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody waits for the answer
                loop.call_soon_threadsafe(_settle, future, ok, value)


class OneTripCursor:
    """The cursor of a :class:`OneTripConnection`: ``execute`` is one trip to the connection's thread (see the module
    docstring). Awaitable and an async context manager, as what aiosqlite's ``Connection.cursor()`` returns.

    Its rows are buffered: the fetches read the buffer, and ``close`` has nothing left to close on the thread.
    """

    def __init__(self, trips: Trips) -> None:
        self._trips = trips
        self._outcome: _Outcome = _NO_OUTCOME
        self._next = 0
        self._arraysize = 1
        self._row_factory: Any = None

    def __await__(self) -> Generator[Any, None, OneTripCursor]:
        return self
        yield  # pragma: no cover  (makes this a generator: ``await`` of it returns at once)

    async def __aenter__(self) -> OneTripCursor:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

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
        await self._trips.send(_script, sql_script)
        self._outcome, self._next = _NO_OUTCOME, 0
        return self

    async def _trip(self, sql: str, parameters: Any, *, many: bool) -> None:
        self._outcome = await self._trips.send(_run, sql, parameters, many, self._row_factory)
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

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._rows()

    async def _rows(self) -> AsyncIterator[Any]:
        while (row := await self.fetchone()) is not None:
            yield row

    async def close(self) -> None:
        """Nothing to close on the thread (``execute`` closed the sqlite3 cursor); the buffer is dropped."""
        self._outcome, self._next = _NO_OUTCOME, 0

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
    def connection(self) -> sqlite3.Connection | None:
        return self._trips.sqlite


class OneTripConnection(aiosqlite.Connection):
    """An aiosqlite connection whose cursors are :class:`OneTripCursor` (made without a trip), whose statements, commit
    and rollback are trips to TurnKit's thread of the connection (:class:`Trips`), whose BEGIN travels with the
    transaction's first statement, and whose rollback outside a transaction makes no trip. Only aiosqlite's public
    methods are overridden; its own state is never touched (the module docstring)."""

    def __init__(self, trips: Trips) -> None:
        super().__init__(trips.connector, 64)
        self.__trips = trips  # name-mangled: never one of aiosqlite's own attributes

    @property
    def trips(self) -> Trips:
        """The connection's thread and what it knows of the transaction."""
        return self.__trips

    def begin_with_next_statement(self, begin: str) -> None:
        """Send ``begin`` (``BEGIN IMMEDIATE``) in the same trip as the next statement instead of in one of its own.

        Nothing else runs on this connection in between: SQLAlchemy's transaction goes on with a statement, or ends
        (then the BEGIN is dropped: a commit or rollback of a transaction that never started does nothing)."""
        self.__trips.begin = begin

    async def commit(self) -> None:
        """Commit, unless the transaction never sent a statement (nothing to commit: no trip)."""
        trips = self.__trips
        if trips.take_begin() is not None and trips.surely_idle():
            return
        await trips.run(_commit, trips.sqlite)

    async def rollback(self) -> None:
        """Roll back; no trip when no transaction is open (sqlite3's rollback would do nothing). SQLAlchemy's pool
        rolls back every connection it takes back, also right after a commit. A trip still running (its ``await``
        was cancelled) may yet open one: then the rollback is queued behind it, as before."""
        trips = self.__trips
        trips.take_begin()
        if trips.surely_idle():
            return
        await trips.run(_rollback, trips.sqlite)

    def cursor(self) -> OneTripCursor:  # pyright: ignore[reportIncompatibleMethodOverride]
        """A cursor (awaitable and an async context manager, as aiosqlite's)."""
        return OneTripCursor(self.__trips)

    async def close(self) -> None:
        """Close the connection on its thread once the trips queued have run, end the thread, then let aiosqlite end
        its own."""
        trips = self.__trips
        try:
            if not trips.stopped and trips.sqlite is not None:
                await trips.run(trips.close_sqlite)
        finally:
            trips.stop()
        await super().close()

    def stop(self) -> asyncio.Future[Any] | None:
        """End both threads at once (aiosqlite's closes the connection): SQLAlchemy's terminate, aiosqlite's
        ``__del__`` (aiosqlite 0.22 on; before it, nothing calls it)."""
        self.__trips.stop()
        stop = getattr(super(), "stop", None)
        return stop() if stop is not None else None


def _commit(connection: sqlite3.Connection) -> None:
    connection.commit()


def _rollback(connection: sqlite3.Connection) -> None:
    connection.rollback()


async def _connect(database: str, **kwargs: Any) -> OneTripConnection:
    """What ``aiosqlite.connect`` does, with a :class:`OneTripConnection` (SQLAlchemy awaits it)."""
    trips = Trips(database, kwargs)
    try:
        # Made on the daemon thread: aiosqlite's thread, made with the connection, inherits its daemon flag.
        connection: OneTripConnection = await trips.call(OneTripConnection, trips)
        await connection  # aiosqlite starts its thread and opens the sqlite3 connection there
        return connection
    except BaseException:
        trips.stop()
        raise


def use_one_trip_cursors(engine: AsyncEngine) -> None:
    """Make ``engine`` (``sqlite+aiosqlite``) open :class:`OneTripConnection`\\ s, with the URL's own connect
    arguments (the database, ``timeout``, ``uri``...)."""

    @event.listens_for(engine.sync_engine, "do_connect")
    def _one_trip(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        # The adapter calls it with the connect arguments and awaits it.
        cparams["async_creator_fn"] = _connect
