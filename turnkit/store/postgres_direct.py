"""PostgreSQL store statements sent straight to asyncpg (CPU per turn, issue 9; ``turnkit/store/direct.py``).

Through SQLAlchemy's asyncio layer a prebuilt statement of the store cost ~100-150 µs of the process's CPU above what
asyncpg itself spends on the round trip: a greenlet crossed twice, the compiled cache's key, an execution context
(parameters, processors), a cursor adapter and a ``CursorResult``. A K = 1 turn sends 35 statements. Here a
statement compiled once (:class:`~turnkit.store.direct.DirectStatements`) runs on an asyncpg prepared statement, kept
per connection as SQLAlchemy's adapter keeps its own, and its rows become SQLAlchemy ``Row`` objects through
SQLAlchemy's own result processors.

Only public APIs (issue 37): the asyncpg connection is the pool's ``driver_connection``; the prepared statements are
asyncpg's ``Connection.prepare``, kept in the pool's ``info`` of the connection (they live and die with it); the
transaction is asyncpg's ``BEGIN``/``COMMIT``/``ROLLBACK``; the errors are mapped by this module to the PEP 249
classes of the dialect's DBAPI module, then wrapped by ``sqlalchemy.exc.DBAPIError.instance``.

What stays SQLAlchemy's, so that the store's fault handling (issue 8) sees what it always saw:

- **The connection and the transaction's bookkeeping.** A :class:`DirectConnection` wraps the store transaction's
  ``AsyncConnection``: the pool and its idle ping are SQLAlchemy's; so are the transaction's bookkeeping and events
  (``begin``, ``commit``, ``rollback``), its savepoints and the statements of SQLAlchemy's own path. The store's
  transactions run on the pool's connections in SQLAlchemy's ``AUTOCOMMIT`` mode, so that SQLAlchemy's adapter never
  opens or ends a transaction on the driver by itself; the :class:`DirectConnection` sends ``BEGIN`` before the
  transaction's first statement (of either path), and ``COMMIT`` or ``ROLLBACK`` at its end, straight through
  asyncpg. SQLAlchemy's ``begin()``, ``commit()`` and ``rollback()`` then have nothing left to send: no greenlet, no
  round trip. Every statement of both paths, and every SAVEPOINT, runs inside that one driver transaction.
- **The errors.** A driver error raises what SQLAlchemy's path raises: the same ``sqlalchemy.exc`` class
  (``IntegrityError``, ``ProgrammingError``, ``DBAPIError``…), whose ``orig`` is the dialect's DBAPI error with the
  SQLSTATE and the asyncpg error as its cause. A lost connection (asyncpg says it is closed) is handed to
  SQLAlchemy's own handling (:meth:`DirectConnection._lost`): the connection invalidated, and the pool's older
  connections with it, and ``connection_invalidated`` set. A cancelled statement invalidates the connection, as it
  does on SQLAlchemy's path: its protocol state is unknown.
- **The events.** ``before_cursor_execute`` and ``after_cursor_execute`` listeners on the engine see each statement
  (the store's statement counts in tests and benchmarks), with a :class:`~turnkit.store.direct.DirectCursor` that
  carries its row count.

``Store.open(url, direct=False)`` sends every statement through SQLAlchemy's asyncio layer.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from collections.abc import Generator, Mapping
from typing import Any, Final, NoReturn

import asyncpg
from asyncpg.prepared_stmt import PreparedStatement
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncTransaction
from sqlalchemy.sql.base import Executable

from turnkit.store.direct import CompiledStatement, DirectCursor, DirectResult, DirectStatements, driver_error

__all__ = ["DRIVER_TRANSACTION", "PREPARED_KEPT", "DirectConnection", "PreparedStatements", "prepared_statements_kept"]

#: The execution option (True) of the connections whose transactions a :class:`DirectConnection` sends to the driver
#: (in SQLAlchemy's AUTOCOMMIT mode, where a ``begin`` event otherwise means no BEGIN is sent).
DRIVER_TRANSACTION: Final = "turnkit_driver_transaction"
_STATUS_COUNT: Final = re.compile(r"(?:SELECT|UPDATE|DELETE|INSERT \d+) (\d+)")
#: Where a pooled connection keeps its prepared statements (``PoolProxiedConnection.info``: as long as the asyncpg
#: connection lives).
_PREPARED: Final = "turnkit_prepared_statements"
#: Prepared statements kept per connection, as SQLAlchemy's asyncpg adapter keeps by default (its URL parameter
#: ``prepared_statement_cache_size`` sets both).
PREPARED_KEPT: Final = 100

#: asyncpg's exceptions and the PEP 249 class of the dialect's DBAPI module that SQLAlchemy's asyncpg dialect raises for
#: each (the most derived class in an exception's MRO decides); anything else is raised as it is, as on its path.
_PEP_249: Final[Mapping[type[BaseException], str]] = {
    asyncpg.exceptions.IntegrityConstraintViolationError: "IntegrityError",
    asyncpg.exceptions.PostgresError: "Error",
    asyncpg.exceptions.SyntaxOrAccessError: "ProgrammingError",
    asyncpg.exceptions.InterfaceError: "InterfaceError",
    asyncpg.exceptions.InvalidCachedStatementError: "NotSupportedError",
    asyncpg.exceptions.InternalServerError: "InternalError",
    asyncpg.exceptions.InternalClientError: "InternalError",
}
#: What says a connection's prepared statements describe a schema that changed under them (DDL since they were made).
_STALE_PLANS: Final = (asyncpg.exceptions.InvalidCachedStatementError, asyncpg.exceptions.OutdatedSchemaCacheError)


def prepared_statements_kept(url: str | URL) -> int:
    """Prepared statements to keep per connection for the store at ``url``: its ``prepared_statement_cache_size``
    (SQLAlchemy's asyncpg parameter; 0 prepares each statement anew, as for pgbouncer), else :data:`PREPARED_KEPT`."""
    value = make_url(url).query.get("prepared_statement_cache_size")
    return int(value) if isinstance(value, str) else PREPARED_KEPT


class PreparedStatements:
    """The prepared statements of one asyncpg connection, by SQL (least recently used dropped first), with the type
    codes of their columns; and the schema generation they were made for (:meth:`DirectConnection._prepare`)."""

    __slots__ = ("generation", "kept", "statements")

    def __init__(self, kept: int, generation: int) -> None:
        self.kept = kept
        self.generation = generation
        self.statements: OrderedDict[str, tuple[PreparedStatement, list[int]]] = OrderedDict()


class _Driver:
    """A transaction's asyncpg connection and its prepared statements (looked up once per transaction)."""

    __slots__ = ("connection", "prepared")

    def __init__(self, connection: asyncpg.Connection, prepared: PreparedStatements) -> None:
        self.connection = connection
        self.prepared = prepared


class DirectConnection:
    """A PostgreSQL store transaction's handle: the methods of ``AsyncConnection`` the store uses, its prebuilt
    statements sent straight to asyncpg (see the module docstring), the rest to ``AsyncConnection``.

    Its ``connection`` must be in SQLAlchemy's ``AUTOCOMMIT`` mode: :meth:`begin` starts a transaction that this class
    sends to the driver itself. Without :meth:`begin`, each statement commits alone."""

    def __init__(self, connection: AsyncConnection, statements: DirectStatements, prepared_kept: int = PREPARED_KEPT):
        #: The SQLAlchemy connection that holds the transaction.
        self.connection = connection
        self._statements = statements
        self._prepared_kept = prepared_kept
        self._driver_state: _Driver | None = None
        sync = connection.sync_connection
        assert sync is not None  # started by engine.connect()
        self._sync: Connection = sync
        self._direct = not sync.engine.echo
        #: A BEGIN is due before the next statement (:meth:`begin` was called, and no statement has run since).
        self._begin_due = False
        #: The driver's transaction is open (its BEGIN was sent, its COMMIT or ROLLBACK not yet).
        self._in_transaction = False

    async def execute(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """Execute ``statement``: directly when it is a prebuilt statement of the store, else through SQLAlchemy."""
        params = parameters or {}
        compiled = self._statements.compiled(statement, params) if self._direct else None
        if self._begin_due:
            await self._begin_on_driver()
        if compiled is None:
            result = await self.connection.execute(statement, parameters)
            self._statements.learn(statement, parameters, result)
            return result
        return await self._run(compiled, params)

    async def scalar(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row of ``statement``, or None."""
        return (await self.execute(statement, parameters)).scalar()

    async def scalars(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """The first column of every row of ``statement``."""
        return (await self.execute(statement, parameters)).scalars()

    async def exec_driver_sql(self, statement: str, parameters: Any = None) -> Any:
        """Execute a SQL string as the driver takes it (SQLAlchemy's path)."""
        if self._begin_due:
            await self._begin_on_driver()
        return await self.connection.exec_driver_sql(statement, parameters)

    def in_nested_transaction(self) -> bool:
        """Whether a SAVEPOINT is open."""
        return self.connection.in_nested_transaction()

    def begin_nested(self) -> Savepoint:
        """A SAVEPOINT inside the transaction (SQLAlchemy's; ``await`` it, or use it as an async context manager)."""
        return Savepoint(self)

    def begin(self) -> None:
        """Begin the transaction: SQLAlchemy's bookkeeping and events now (no greenlet, no round trip); the driver's
        BEGIN before the first statement."""
        self._sync.begin()
        self._begin_due = True

    async def commit(self) -> None:
        """COMMIT the driver's transaction straight through asyncpg, then close SQLAlchemy's, which then has nothing
        left to send (no greenlet)."""
        self._begin_due = False  # a transaction that ran no statement has nothing to commit
        if self._in_transaction:
            self._in_transaction = False  # ended, committed or not (a failed COMMIT ends it too)
            try:
                await self._driver().connection.execute("COMMIT")
            except BaseException as error:  # translated and raised as SQLAlchemy's path raises it
                await self._raise(error, "COMMIT", [])
        self._sync.commit()

    async def rollback(self) -> None:
        """Roll the transaction back (after an error, which this never hides: a failed rollback invalidates the
        connection instead of raising)."""
        self._begin_due = False
        if self.connection.invalidated:  # nothing of it is left on the database's side
            self._in_transaction = False
            return
        if self._in_transaction:
            self._in_transaction = False
            try:
                await self._driver().connection.execute("ROLLBACK")
            except BaseException as error:  # the connection is in an unknown state: the pool must not reuse it
                self._sync.invalidate()
                if not isinstance(error, Exception):
                    raise
                return
        if self._sync.in_transaction():
            self._sync.rollback()  # its bookkeeping and events: nothing is sent (AUTOCOMMIT)

    async def ensure_begun(self) -> None:
        """Send the transaction's BEGIN now if it is due (before a statement that does not come through here)."""
        if self._begin_due:
            await self._begin_on_driver()

    async def _begin_on_driver(self) -> None:
        self._begin_due = False
        driver = self._driver()
        try:
            await driver.connection.execute("BEGIN")
        except BaseException as error:
            await self._raise(error, "BEGIN", [])
        self._in_transaction = True

    def _driver(self) -> _Driver:
        """The asyncpg connection under the transaction (the pool's ``driver_connection``) and its prepared statements
        (in the pool's ``info`` of the connection)."""
        driver = self._driver_state
        if driver is None:
            pooled = self._sync.connection
            prepared = pooled.info.get(_PREPARED)
            if not isinstance(prepared, PreparedStatements):
                prepared = pooled.info[_PREPARED] = PreparedStatements(self._prepared_kept, self._statements.generation)
            connection = pooled.driver_connection
            assert isinstance(connection, asyncpg.Connection)
            driver = self._driver_state = _Driver(connection, prepared)
        return driver

    async def _prepare(self, driver: _Driver, sql: str) -> tuple[PreparedStatement, list[int]]:
        """``sql``'s prepared statement on the connection, and its columns' type codes: kept, or made now."""
        prepared = driver.prepared
        if prepared.generation != self._statements.generation:  # a schema change was seen since: make them anew
            prepared.statements.clear()
            prepared.generation = self._statements.generation
            await driver.connection.reload_schema_state()
        kept = prepared.statements.get(sql)
        if kept is not None:
            prepared.statements.move_to_end(sql)
            return kept
        statement = await driver.connection.prepare(sql)
        made = (statement, [attribute.type.oid for attribute in statement.get_attributes()])
        if prepared.kept > 0:
            prepared.statements[sql] = made
            if len(prepared.statements) > prepared.kept:
                prepared.statements.popitem(last=False)
        return made

    async def _run(self, compiled: CompiledStatement, parameters: Mapping[str, Any]) -> DirectResult:
        sql, arguments = compiled.arguments(parameters)
        events = self._sync.dispatch
        listened = bool(events.before_cursor_execute or events.after_cursor_execute)
        cursor = DirectCursor() if listened else None
        if listened:
            for listener in events.before_cursor_execute:
                listener(self._sync, cursor, sql, arguments, None, False)
        driver = self._driver()
        try:
            prepared, type_codes = await self._prepare(driver, sql)
            records = await prepared.fetch(*arguments)
            status = prepared.get_statusmsg()
        except BaseException as error:  # every error is translated as SQLAlchemy's path translates it, then raised
            if isinstance(error, _STALE_PLANS):
                self._statements.generation += 1  # every connection makes its prepared statements anew
            await self._raise(error, sql, arguments)
        counted = _STATUS_COUNT.match(status or "")
        rowcount = int(counted.group(1)) if counted else -1
        if cursor is not None:
            cursor.rowcount = rowcount
            for listener in events.after_cursor_execute:
                listener(self._sync, cursor, sql, arguments, None, False)
        codes = None if compiled.result_processors is not None else type_codes
        return DirectResult(compiled.rows(self._statements.dialect, records, codes), rowcount)

    async def _raise(self, error: BaseException, sql: str, arguments: list[Any]) -> NoReturn:
        """Raise what SQLAlchemy's path raises for ``error``: the dialect's DBAPI error wrapped in ``sqlalchemy.exc``,
        the connection invalidated on a disconnect (and the pool's older ones, :meth:`_lost`) or a cancellation."""
        if not isinstance(error, Exception):  # cancelled mid-statement: the connection's protocol state is unknown
            self._in_transaction = False
            if not self.connection.invalidated:
                self._sync.invalidate()
            raise error
        translated = _pep_249(error, self._sync.dialect.loaded_dbapi)
        lost = self._driver().connection.is_closed()
        if lost:
            self._in_transaction = False
            await self._lost()
        raised = driver_error(self._sync, translated, sql, arguments, disconnect=lost) if translated else error
        if raised is error:
            raise error
        raise raised from translated

    async def _lost(self) -> None:
        """SQLAlchemy's own handling of a lost connection: a statement on it through SQLAlchemy fails at once (asyncpg
        knows it is closed), and SQLAlchemy invalidates it, and every pooled connection older than it (the database
        restarted: they are gone too), and runs its ``handle_error`` events."""
        if self.connection.invalidated:
            return
        with contextlib.suppress(SQLAlchemyError):  # that failure, as SQLAlchemy raises it
            await self.connection.exec_driver_sql("SELECT 1")
        if not self.connection.invalidated:  # SQLAlchemy did not get to it (its transaction had failed before)
            self._sync.invalidate()


def _pep_249(error: Exception, dbapi: Any) -> Exception | None:
    """``error`` (asyncpg's) as the PEP 249 exception of the dialect's DBAPI module that SQLAlchemy's asyncpg dialect
    makes of it (its SQLSTATE as ``sqlstate`` and ``pgcode``, ``error`` as its ``orig`` and its cause), or None when
    SQLAlchemy's path would raise ``error`` as it is."""
    for kind in type(error).__mro__:
        name = _PEP_249.get(kind)
        if name is not None:
            translated: Exception = getattr(dbapi, name)(error.args[0] if error.args else str(error), error)
            translated.__cause__ = error
            return translated
    return None


class Savepoint:
    """:meth:`DirectConnection.begin_nested`: SQLAlchemy's SAVEPOINT, after the transaction's BEGIN. Awaitable (the
    ``AsyncTransaction``) and an async context manager, as ``AsyncConnection.begin_nested()``."""

    def __init__(self, connection: DirectConnection) -> None:
        self._connection = connection
        self._transaction: AsyncTransaction | None = None

    async def _start(self) -> AsyncTransaction:
        await self._connection.ensure_begun()
        self._transaction = await self._connection.connection.begin_nested()
        return self._transaction

    def __await__(self) -> Generator[Any, None, AsyncTransaction]:
        return self._start().__await__()

    async def __aenter__(self) -> AsyncTransaction:
        return await self._start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        assert self._transaction is not None
        await self._transaction.__aexit__(exc_type, exc, tb)
