"""PostgreSQL store statements sent straight to asyncpg (CPU per turn, issue 9; ``turnkit/store/direct.py``).

Through SQLAlchemy's asyncio layer a prebuilt statement of the store cost ~100-150 µs of the process's CPU above what
asyncpg itself spends on the round trip: a greenlet crossed twice, the compiled cache's key, an execution context
(parameters, processors), a cursor adapter and a ``CursorResult``. A K = 1 turn sends 35 statements. Here a
statement compiled once (:class:`~turnkit.store.direct.DirectStatements`) runs on asyncpg's prepared statement (the
same per-connection cache SQLAlchemy's adapter keeps), and its rows become SQLAlchemy ``Row`` objects through
SQLAlchemy's own result processors.

What stays SQLAlchemy's, so that the store's fault handling (issue 8) sees what it always saw:

- **The connection and the transaction.** A :class:`DirectConnection` wraps the store transaction's
  ``AsyncConnection``: the pool and its idle ping are SQLAlchemy's; so are the transaction's bookkeeping and events
  (``begin``, ``commit``), its savepoints and its ROLLBACK. The driver's transaction is begun by SQLAlchemy's adapter
  before the first statement, as on SQLAlchemy's path, and holds the statements of both paths. Only its COMMIT is
  sent straight to asyncpg, after which SQLAlchemy's commit has nothing left to send: ``AsyncConnection.begin()``
  and ``commit()`` each crossed a greenlet, two of a transaction's four crossings.
- **The errors.** A driver error goes through SQLAlchemy's adapter and its connection's error handling: the same
  ``sqlalchemy.exc`` classes (``DBAPIError`` with the asyncpg error as its cause), the same disconnect detection and
  invalidation of the connection and of the pool's older connections. A cancelled statement invalidates the
  connection, as it does on SQLAlchemy's path: its protocol state is unknown.
- **The events.** ``before_cursor_execute`` and ``after_cursor_execute`` listeners on the engine see each statement
  (the store's statement counts in tests and benchmarks), with a :class:`~turnkit.store.direct.DirectCursor` that
  carries its row count.

``Store.open(url, direct=False)`` sends every statement through SQLAlchemy's asyncio layer.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, NoReturn

from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncTransaction
from sqlalchemy.sql.base import Executable

from turnkit.store.direct import CompiledStatement, DirectCursor, DirectResult, DirectStatements

__all__ = ["DirectConnection"]

_STATUS_COUNT: Final = re.compile(r"(?:SELECT|UPDATE|DELETE|INSERT \d+) (\d+)")


class DirectConnection:
    """A PostgreSQL store transaction's handle: the methods of ``AsyncConnection`` the store uses, its prebuilt
    statements sent straight to asyncpg (see the module docstring), the rest to ``AsyncConnection``."""

    def __init__(self, connection: AsyncConnection, statements: DirectStatements) -> None:
        #: The SQLAlchemy connection that holds the transaction.
        self.connection = connection
        self._statements = statements
        self._adapter: AsyncAdapt_asyncpg_connection | None = None
        sync = connection.sync_connection
        assert sync is not None  # started by engine.connect()
        self._sync: Connection = sync
        engine = sync.engine
        self._direct = not engine.echo

    async def execute(self, statement: Executable, parameters: Mapping[str, Any] | None = None) -> Any:
        """Execute ``statement``: directly when it is a prebuilt statement of the store, else through SQLAlchemy."""
        params = parameters or {}
        compiled = self._statements.compiled(statement, params) if self._direct else None
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
        return await self.connection.exec_driver_sql(statement, parameters)

    def in_nested_transaction(self) -> bool:
        """Whether a SAVEPOINT is open."""
        return self.connection.in_nested_transaction()

    def begin_nested(self) -> AsyncTransaction:
        """A SAVEPOINT inside the transaction (SQLAlchemy's)."""
        return self.connection.begin_nested()

    def begin(self) -> None:
        """Begin SQLAlchemy's transaction on the connection: its bookkeeping and events only, no greenlet, no round
        trip (the BEGIN goes out before the first statement, sent by SQLAlchemy's adapter)."""
        self._sync.begin()

    async def commit(self) -> None:
        """COMMIT the driver's transaction straight through asyncpg, then close SQLAlchemy's, which then has nothing
        left to send (no greenlet)."""
        adapter = self._driver()  # a statement of either path may have begun the driver's transaction
        transaction = adapter._transaction  # pyright: ignore[reportPrivateUsage]
        if transaction is not None:
            try:
                await transaction.commit()
            except BaseException as error:  # translated and raised as SQLAlchemy's path raises it
                await self._raise(error, adapter, "COMMIT", [])
            finally:
                adapter._transaction = None  # pyright: ignore[reportPrivateUsage]  (ended, committed or not)
        self._sync.commit()

    async def rollback(self) -> None:
        """Roll the transaction back (after an error, which this never hides: a failed rollback invalidates the
        connection instead of raising)."""
        if self.connection.invalidated or not self.connection.in_transaction():
            return
        try:
            await self.connection.rollback()
        except Exception:  # the connection is in an unknown state: the pool must not reuse it
            await self.connection.invalidate()

    def _driver(self) -> AsyncAdapt_asyncpg_connection:
        adapter = self._adapter
        if adapter is None:
            dbapi_connection = self._sync.connection.dbapi_connection
            assert isinstance(dbapi_connection, AsyncAdapt_asyncpg_connection)
            adapter = self._adapter = dbapi_connection
        return adapter

    async def _run(self, compiled: CompiledStatement, parameters: Mapping[str, Any]) -> DirectResult:
        sql, arguments = compiled.arguments(parameters)
        events = self._sync.dispatch
        listened = bool(events.before_cursor_execute or events.after_cursor_execute)
        cursor = DirectCursor() if listened else None
        if listened:
            for listener in events.before_cursor_execute:
                listener(self._sync, cursor, sql, arguments, None, False)
        adapter = self._driver()
        try:
            async with adapter._execute_mutex:  # pyright: ignore[reportPrivateUsage]
                if adapter._transaction is None:  # pyright: ignore[reportPrivateUsage]
                    await adapter._start_transaction()  # pyright: ignore[reportPrivateUsage]  (the BEGIN, as its cursor)
                schema_as_of = self._statements.dialect._invalidate_schema_cache_asof  # pyright: ignore
                prepared, attributes = await adapter._prepare(sql, schema_as_of)  # pyright: ignore[reportPrivateUsage]
                records = await prepared.fetch(*arguments)
                status = prepared.get_statusmsg()
        except BaseException as error:  # every error is SQLAlchemy's to translate, then raised
            await self._raise(error, adapter, sql, arguments)
        counted = _STATUS_COUNT.match(status or "")
        rowcount = int(counted.group(1)) if counted else -1
        if cursor is not None:
            cursor.rowcount = rowcount
            for listener in events.after_cursor_execute:
                listener(self._sync, cursor, sql, arguments, None, False)
        type_codes = None if compiled.result_processors is not None else [a.type.oid for a in attributes]
        return DirectResult(compiled.rows(self._statements.dialect, records, type_codes), rowcount)

    async def _raise(
        self, error: BaseException, adapter: AsyncAdapt_asyncpg_connection, sql: str, arguments: list[Any]
    ) -> NoReturn:
        """Raise what SQLAlchemy's path raises for ``error``: the adapter's DBAPI error wrapped in ``sqlalchemy.exc``,
        the connection invalidated on a disconnect or a cancellation."""
        if isinstance(error, Exception):
            try:
                adapter._handle_exception(error)  # pyright: ignore[reportPrivateUsage]  (always raises)
            except Exception as translated:
                error = translated
        await self.connection.run_sync(_handle_dbapi_exception, error, sql, arguments)
        raise error  # pragma: no cover  (the handler always raises)


def _handle_dbapi_exception(connection: Connection, error: BaseException, sql: str, arguments: list[Any]) -> None:
    """SQLAlchemy's handling of a driver error on ``connection`` (in its greenlet): wrap, invalidate, raise."""
    try:
        raise error
    except BaseException as raised:  # re-raised by SQLAlchemy's handler, wrapped or as it is
        connection._handle_dbapi_exception(raised, sql, arguments, None, None)  # pyright: ignore[reportPrivateUsage]
