"""SQLite store transactions on SQLAlchemy's synchronous engine, on the event loop's thread (CPU per turn, issue 9).

The store's SQLite statements already ran on the event loop's thread (they are indexed reads and writes of a few
rows, and a hand-off to a driver thread cost more than the work), but through SQLAlchemy's asyncio layer: every
statement crossed a greenlet twice and went through the aiosqlite adapter, for a call that never waited. Measured on
one indexed read: 206 µs of CPU through ``AsyncConnection`` against 72 µs through a synchronous ``Connection``; a
transaction of one read 606 against 253 µs (docs/design.md, "On SQLite, a transaction runs synchronously on the
event loop's thread"). Here a store transaction runs on a synchronous ``Connection`` of SQLAlchemy's ``pysqlite``
dialect instead: the same statements, the same type processing, the same transactions. Only the plumbing between
them and ``sqlite3`` changes.

What keeps the event loop from ever blocking on SQLite:

- **WAL mode only** (:meth:`InlineSQLite.open` answers None otherwise, and the store keeps its aiosqlite engine): in
  WAL mode a statement waits for no lock once its transaction holds the writer lock, and a commit waits for no
  reader. SQLite's automatic checkpoint (an fsync inside a commit) is off on this connection; every
  :data:`CHECKPOINT_EVERY` commits a ``PASSIVE`` checkpoint runs on a thread, on a connection of its own.
- **One connection, one transaction at a time.** Every store transaction on SQLite is ``BEGIN IMMEDIATE`` (it takes
  the writer lock first), so this process's transactions were already run one after another by SQLite's lock. An
  ``asyncio.Lock`` orders them instead, without a connection per waiter and without a thread.
- **Only the BEGIN can wait** (for another process's writer: a worker and a CLI on the same file). It is tried with
  SQLite's busy timeout at zero; while the lock is taken the transaction sleeps on the event loop and tries again
  (1 ms, doubling up to 25 ms), for up to :data:`BUSY_TIMEOUT` seconds, then raises SQLite's own "database is
  locked", which the store's callers treat as transient.

The store's prebuilt statements, compiled once, run on the ``sqlite3`` connection under SQLAlchemy's
(``turnkit/store/direct.py``): SQLAlchemy's ``Connection.execute`` cost ~75% of the store's CPU on SQLite, ``sqlite3``
itself ~7%. Its events still see each of them, and a driver error raises what SQLAlchemy's path raises for it.

What is given up, as before: a long statement blocks the event loop while it runs (``turnkit check`` on a large store
belongs in a process of its own, or on PostgreSQL), and a transaction with no ``await`` between its statements
cannot be cancelled half-way. ``Store.open(url, sqlite_inline=False)`` keeps every statement on aiosqlite's thread.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncGenerator, Generator, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import Connection, CursorResult, NestedTransaction
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.base import Executable

from turnkit.store.direct import CompiledStatement, DirectResult, DirectStatements, driver_error
from turnkit.store.storable import json_text, written_json

__all__ = ["BUSY_TIMEOUT", "CHECKPOINT_EVERY", "InlineConnection", "InlineSQLite", "InlineSavepoint"]

_log = logging.getLogger(__name__)

#: Commits between two checkpoints run on a thread. SQLite's own automatic checkpoint comes every 1,000 WAL pages; a
#: store transaction writes a few pages.
CHECKPOINT_EVERY = 200
#: How long a transaction's BEGIN waits for another process's writer before it raises "database is locked" (what
#: SQLite's busy timeout was on the store's connections).
BUSY_TIMEOUT = 60.0
_FIRST_RETRY = 0.001
_LONGEST_RETRY = 0.025

#: What SQLite answers when another connection holds the lock that a statement needs (with its extended codes).
_LOCK_ERRORS = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})


class InlineSavepoint:
    """A SAVEPOINT of an :class:`InlineConnection`: awaitable and an async context manager, as SQLAlchemy's
    ``AsyncTransaction`` from ``AsyncConnection.begin_nested()``."""

    def __init__(self, nested: NestedTransaction) -> None:
        self._nested = nested

    def __await__(self) -> Generator[Any, None, InlineSavepoint]:
        return self
        yield  # pragma: no cover  (makes this a generator: ``await`` of it returns at once)

    async def commit(self) -> None:
        """Release the savepoint (its writes stay in the transaction)."""
        self._nested.commit()

    async def rollback(self) -> None:
        """Roll back to the savepoint (its writes are undone; the transaction goes on)."""
        self._nested.rollback()

    async def __aenter__(self) -> InlineSavepoint:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if not self._nested.is_active:
            return
        if exc_type is None:
            self._nested.commit()
        else:
            self._nested.rollback()


class InlineConnection:
    """A store transaction's handle on SQLite: the methods of ``AsyncConnection`` the store uses, run synchronously
    on a ``Connection`` of SQLAlchemy's synchronous engine (see the module docstring); the store's prebuilt
    statements, compiled once, on the ``sqlite3`` connection under it (``turnkit/store/direct.py``)."""

    def __init__(self, connection: Connection, statements: DirectStatements | None = None) -> None:
        #: The synchronous connection, inside the transaction.
        self.sync_connection = connection
        self._statements = statements

    async def execute(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """Execute ``statement`` (its rows are read from the result, as from ``AsyncConnection.execute``)."""
        return self._execute(statement, parameters)

    async def scalar(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row of ``statement``, or None."""
        return self._execute(statement, parameters).scalar()

    async def scalars(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """The first column of every row of ``statement``."""
        return self._execute(statement, parameters).scalars()

    def _execute(self, statement: Executable, parameters: Mapping[str, Any] | None) -> Any:
        params = parameters or {}
        statements = self._statements
        compiled = None if statements is None else statements.compiled(statement, params)
        if compiled is None:
            result = self.sync_connection.execute(statement, parameters)
            if statements is not None:
                statements.learn(statement, parameters, result)
            return result
        return self._run(compiled, params)

    def _run(self, compiled: CompiledStatement, parameters: Mapping[str, Any]) -> DirectResult:
        """One prebuilt statement on ``sqlite3`` itself, with SQLAlchemy's events and exceptions."""
        connection = self.sync_connection
        sql, arguments = compiled.arguments(parameters)
        raw: Any = connection.connection.dbapi_connection
        cursor: Any = raw.cursor()
        try:
            events = connection.dispatch
            for listener in events.before_cursor_execute:
                listener(connection, cursor, sql, arguments, None, False)
            try:
                cursor.execute(sql, arguments)
            except Exception as error:
                # As on SQLAlchemy's path: the same sqlalchemy.exc classes (issue 8's checks), and a connection that
                # SQLite says is gone is invalidated (the next transaction opens a new one).
                dialect = connection.dialect
                gone = isinstance(error, dialect.loaded_dbapi.Error) and dialect.is_disconnect(
                    error, connection.connection, cursor
                )
                raised = driver_error(connection, error, sql, arguments, disconnect=gone)
                if gone:
                    connection.invalidate(error)
                if raised is error:
                    raise
                raise raised from error
            for listener in events.after_cursor_execute:
                listener(connection, cursor, sql, arguments, None, False)
            records = cursor.fetchall() if compiled.returns_rows else []
            key = (cursor.lastrowid,) if compiled.reads_last_row_id else None
            rows = compiled.rows(connection.dialect, records, None)
            return DirectResult(rows, cursor.rowcount, key)
        finally:
            cursor.close()

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> CursorResult[Any]:
        """Execute a SQL string as the driver takes it."""
        return self.sync_connection.exec_driver_sql(statement, parameters)

    def in_nested_transaction(self) -> bool:
        """Whether a SAVEPOINT is open."""
        return self.sync_connection.in_nested_transaction()

    def begin_nested(self) -> InlineSavepoint:
        """A SAVEPOINT inside the transaction (``await`` it, or use it as an async context manager)."""
        return InlineSavepoint(self.sync_connection.begin_nested())


def _checkpoint(path: str) -> None:
    """On a thread, on a connection of its own: copy what it can of the WAL into the database file. A failure is
    logged, never raised: the commits before it stand, and the next checkpoint copies what this one did not."""
    try:
        connection = sqlite3.connect(path, timeout=0)
        try:
            connection.execute("PRAGMA wal_checkpoint(PASSIVE)").close()
        finally:
            connection.close()
    except sqlite3.Error as err:
        _log.warning("SQLite checkpoint failed (the next one retries): %s", err)


def _locked(err: sqlite3.OperationalError) -> bool:
    return getattr(err, "sqlite_errorcode", 0) & 0xFF in _LOCK_ERRORS


class InlineSQLite:
    """The store's transactions on one SQLite file, on the event loop's thread (see the module docstring)."""

    def __init__(self, path: str, engine: Engine) -> None:
        self.path = path
        #: SQLAlchemy's synchronous engine on the file (one connection), for its events (``bench/cpu_profile.py``).
        self.engine = engine
        #: The store's prebuilt statements compiled for SQLite (``turnkit/store/direct.py``); none while the engine
        #: echoes its SQL (SQLAlchemy's path logs it).
        self.statements: DirectStatements | None = None if engine.echo else DirectStatements(engine.dialect)
        self._connection: Connection | None = None
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()
        self._commits = 0
        #: Held by the transaction running: a second event loop (another thread) must not use the connection meanwhile.
        self._in_use = threading.Lock()
        self._checkpoint_due = False
        self._checkpointer: asyncio.Task[None] | None = None

    @classmethod
    def open(cls, path: str, *, echo: bool = False, direct: bool = True) -> InlineSQLite | None:
        """Transactions on the database file ``path``, or None when SQLite cannot put it in WAL mode (then a
        statement could wait for a lock: the store keeps aiosqlite's thread). ``direct=False``: every statement through
        SQLAlchemy's ``Connection.execute`` (``turnkit/store/direct.py``)."""
        engine = create_engine(
            f"sqlite:///{path}",
            echo=echo,
            poolclass=StaticPool,  # one connection: this process's transactions run one at a time (module docstring)
            connect_args={"check_same_thread": False, "isolation_level": None},
            json_serializer=json_text,  # keys sorted, so that written_json reads the canonical form back
            json_deserializer=written_json,  # the text as the store wrote it (storable.written_json)
        )
        event.listen(engine, "connect", _configure)
        inline = cls(path, engine)
        if not direct:
            inline.statements = None
        raw: Any = inline._sync().connection.dbapi_connection  # not a statement of SQLAlchemy's: no autobegin
        mode = str(raw.execute("PRAGMA journal_mode").fetchone()[0]).lower()
        if mode != "wal":
            inline.close_now()
            return None
        return inline

    @property
    def dbapi_connection(self) -> sqlite3.Connection:
        """The ``sqlite3`` connection under the transactions (for instrumentation: ``tests/test_store_work.py`` counts
        the rows read with its ``row_factory``)."""
        return cast(sqlite3.Connection, self._sync().connection.dbapi_connection)

    def _sync(self) -> Connection:
        """The connection (a new one after the last was closed or invalidated)."""
        connection = self._connection
        if connection is None or connection.closed or connection.invalidated:
            if connection is not None:
                connection.close()
            connection = self._connection = self.engine.connect()
        return connection

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    @asynccontextmanager
    async def transaction(self) -> AsyncGenerator[InlineConnection, None]:
        """One transaction (``BEGIN IMMEDIATE``): committed when the block ends, rolled back when it raises."""
        lock = self._lock()
        if lock.locked():  # another transaction of this process runs: wait as long as SQLite's busy timeout would
            try:
                async with asyncio.timeout(BUSY_TIMEOUT):
                    await lock.acquire()
            except TimeoutError as err:
                locked = sqlite3.OperationalError("database is locked")
                raise OperationalError("BEGIN IMMEDIATE", None, locked) from err
        else:
            await lock.acquire()
        try:
            if not self._in_use.acquire(blocking=False):
                raise RuntimeError("a store's SQLite transactions run on one event loop at a time")
            try:
                connection = self._sync()
                await self._begin_immediate(connection)
                try:
                    with connection.begin():  # commits at the end of the block; rolls back when it raises
                        yield InlineConnection(connection, self.statements)
                finally:
                    raw: Any = connection.connection.dbapi_connection
                    if raw is not None and raw.in_transaction:  # a failed commit: never leave the lock held
                        raw.rollback()
            finally:
                self._in_use.release()
        finally:
            lock.release()
        self._commits += 1
        if self._commits % CHECKPOINT_EVERY == 0:
            self._checkpoint_due = True
            if self._checkpointer is None or self._checkpointer.done():
                self._checkpointer = asyncio.create_task(self._checkpoints(), name="turnkit-sqlite-checkpoint")

    async def _checkpoints(self) -> None:
        """Run the checkpoints due, one at a time, each on a thread."""
        while self._checkpoint_due:
            self._checkpoint_due = False
            await asyncio.to_thread(_checkpoint, self.path)

    async def _begin_immediate(self, connection: Connection) -> None:
        """``BEGIN IMMEDIATE`` on ``connection``, waiting on the event loop while another process writes."""
        raw: Any = connection.connection.dbapi_connection
        give_up = time.monotonic() + BUSY_TIMEOUT
        delay = _FIRST_RETRY
        while True:
            try:
                raw.execute("BEGIN IMMEDIATE").close()
                return
            except sqlite3.OperationalError as err:
                if not _locked(err) or time.monotonic() + delay > give_up:
                    raise OperationalError("BEGIN IMMEDIATE", None, err) from err
            await asyncio.sleep(delay)
            delay = min(delay * 2, _LONGEST_RETRY)

    async def checkpointed(self) -> None:
        """Wait for the checkpoints due so far (those due while one waits to run are run once, after it)."""
        if self._checkpointer is not None:
            await asyncio.gather(self._checkpointer, return_exceptions=True)

    async def close(self) -> None:
        """Wait for the checkpoints due, then close the connection."""
        await self.checkpointed()
        self.close_now()

    def close_now(self) -> None:
        """Close the connection and the engine at once."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None
        self.engine.dispose()


def _configure(dbapi_connection: Any, _record: Any) -> None:
    """WAL, no busy wait (the BEGIN waits on the event loop instead), no automatic checkpoint (one runs on a thread
    every :data:`CHECKPOINT_EVERY` commits), ``synchronous=NORMAL`` (no fsync at commit in WAL mode)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=0")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA wal_autocheckpoint=0")
    finally:
        cursor.close()
