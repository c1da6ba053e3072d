"""PostgreSQL store statements sent straight to asyncpg, compiled once (CPU per turn, issue 9).

Through SQLAlchemy's asyncio layer a prebuilt statement of the store cost ~100-150 µs of the process's CPU above what
asyncpg itself spends on the round trip: a greenlet crossed twice, the compiled cache's key, an execution context
(parameters, processors), a cursor adapter and a ``CursorResult``. A K = 1 turn sends 35 statements. Here a
statement the store runs again and again is compiled once for PostgreSQL's asyncpg dialect, and each later execution
does only what is left: its parameters through SQLAlchemy's own bind processors, asyncpg's prepared statement (the
same per-connection cache SQLAlchemy's adapter keeps), its rows through SQLAlchemy's own result processors into
SQLAlchemy ``Row`` objects. The SQL, the types and the rows are the ones SQLAlchemy's path gives.

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
  (the store's statement counts in tests and benchmarks), with a :class:`DirectCursor` that carries its row count.

What goes to SQLAlchemy's own path: a statement seen for the first time (ad-hoc queries such as ``turnkit check``'s
are built anew each time and never compiled here), text SQL, statements whose values SQLAlchemy computes at execution
(Python-side column defaults), an INSERT whose generated key SQLAlchemy returns by itself, and everything while the
engine echoes its SQL. ``Store.open(url, postgres_direct=False)`` sends every statement there.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, NoReturn, cast

from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.engine import Connection, Dialect, Row
from sqlalchemy.engine.result import SimpleResultMetaData
from sqlalchemy.exc import MultipleResultsFound
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncTransaction
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Delete, Insert, Update
from sqlalchemy.sql.selectable import Select

__all__ = ["DirectConnection", "DirectCursor", "DirectResult", "DirectStatements"]

#: Distinct statements a store compiles here; past it the cache starts again (the store's own are a few dozen).
STATEMENTS_KEPT: Final = 1_000
_STATUS_COUNT: Final = re.compile(r"(?:SELECT|UPDATE|DELETE|INSERT \d+) (\d+)")
_DIRECT_KINDS: Final = (Select, Insert, Update, Delete)
#: ``Row(parent, processors, key_to_index, data)``: how SQLAlchemy's results make their rows (its typing shows only
#: the public side of ``Row``); the processors run in its compiled row code.
_row: Final = cast(Any, Row)


class _Compiled:
    """One statement compiled for PostgreSQL with one set of parameter keys: its SQL and how to bind and read it."""

    __slots__ = ("compiled", "expands", "processors", "result_metadata", "result_processors", "result_types", "sql")

    def __init__(self, compiled: SQLCompiler) -> None:
        self.compiled = compiled
        self.sql = compiled.string
        #: IN lists given as one list parameter (``bindparam(…, expanding=True)``): the SQL depends on their lengths.
        self.expands = bool(compiled.post_compile_params or compiled.literal_execute_params)
        #: Bind processors by parameter name (a tuple IN's would be a sequence; the store binds none).
        self.processors = cast(
            "Mapping[str, Callable[[Any], Any]]",
            compiled._bind_processors,  # pyright: ignore[reportPrivateUsage]
        )
        columns = compiled._result_columns  # pyright: ignore[reportPrivateUsage]
        self.result_types = [column.type for column in columns]
        self.result_metadata = SimpleResultMetaData([column.keyname for column in columns]) if columns else None
        #: Read off the first execution's column types (a NUMERIC's processor depends on the type PostgreSQL sends).
        self.result_processors: list[Any] | None = None

    def arguments(self, parameters: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SQL to send and its positional arguments, for ``parameters``."""
        compiled = self.compiled
        values = compiled.construct_params(parameters, escape_names=False)
        processors = self.processors
        if self.expands:
            expanded = compiled._process_parameters_for_postcompile(values)  # pyright: ignore[reportPrivateUsage]
            processors = {**processors, **expanded.processors}
            sql, names = expanded.statement, expanded.positiontup
        else:
            sql, names = self.sql, compiled.positiontup
        assert names is not None  # asyncpg's dialect is positional ($1, $2, …)
        return sql, [processors[name](values[name]) if name in processors else values[name] for name in names]


class DirectStatements:
    """A store's statements compiled for the direct path (see the module docstring), shared by its transactions."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._compiled: dict[tuple[object, tuple[str, ...]], _Compiled | None] = {}
        self._seen: dict[tuple[object, tuple[str, ...]], int] = {}

    def compiled(self, statement: Executable, parameters: Mapping[str, Any]) -> _Compiled | None:
        """``statement`` compiled for ``parameters``' keys, or None: SQLAlchemy's own path runs it (a first sight, or
        a statement the direct path does not take)."""
        key = (statement, tuple(parameters))
        try:
            return self._compiled[key]
        except KeyError:
            pass
        if not isinstance(statement, _DIRECT_KINDS):
            return None
        if key not in self._seen:  # seen once: it may be ad hoc; compile it when it comes again
            if len(self._seen) >= STATEMENTS_KEPT:
                self._seen.clear()
            self._seen[key] = 1
            return None
        if len(self._compiled) >= STATEMENTS_KEPT:
            self._compiled.clear()
        compiled = statement.compile(dialect=self.dialect, column_keys=list(parameters))
        assert isinstance(compiled, SQLCompiler)
        self._compiled[key] = entry = None if _needs_context(compiled) else _Compiled(compiled)
        return entry


def _needs_context(compiled: SQLCompiler) -> bool:
    """Whether only SQLAlchemy's execution context can run ``compiled``: values computed at execution (Python-side
    defaults), a generated key it reads back by itself, a schema translation."""
    return bool(
        compiled.insert_prefetch
        or compiled.update_prefetch
        or compiled.implicit_returning
        or compiled.schema_translate_map
    )


class DirectCursor:
    """What a ``before_cursor_execute`` or ``after_cursor_execute`` listener gets as the cursor of a direct statement:
    its ``rowcount`` (set before ``after_cursor_execute``: rows written, or read by a SELECT, as PostgreSQL's command
    status says)."""

    __slots__ = ("rowcount",)

    def __init__(self) -> None:
        self.rowcount = -1


class DirectResult:
    """A direct statement's rows (SQLAlchemy ``Row`` objects, as a ``CursorResult`` yields) and its row count: the
    parts of ``CursorResult`` the store uses."""

    __slots__ = ("_rows", "rowcount")

    def __init__(self, rows: list[Row[Any]], rowcount: int) -> None:
        self._rows = rows
        #: Rows written by an UPDATE or DELETE (or read by a SELECT), from PostgreSQL's command status.
        self.rowcount = rowcount

    def __iter__(self) -> Iterator[Row[Any]]:
        return iter(self._rows)

    def first(self) -> Row[Any] | None:
        """The first row, or None."""
        return self._rows[0] if self._rows else None

    def all(self) -> Sequence[Row[Any]]:
        """Every row."""
        return self._rows

    def one_or_none(self) -> Row[Any] | None:
        """The one row, or None; more than one raises, as SQLAlchemy's does."""
        if len(self._rows) > 1:
            raise MultipleResultsFound("Multiple rows were found when one or none was required")
        return self.first()

    def scalar(self) -> Any:
        """The first column of the first row, or None."""
        return self._rows[0][0] if self._rows else None

    def scalars(self) -> list[Any]:
        """The first column of every row."""
        return [row[0] for row in self._rows]


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
            return await self.connection.execute(statement, parameters)
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

    async def _run(self, compiled: _Compiled, parameters: Mapping[str, Any]) -> DirectResult:
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
        metadata = compiled.result_metadata
        if metadata is None:
            return DirectResult([], rowcount)
        processors = compiled.result_processors
        if processors is None:
            dialect = self._statements.dialect
            processors = compiled.result_processors = [
                type_._cached_result_processor(dialect, attribute.type.oid)  # pyright: ignore[reportPrivateUsage]
                for type_, attribute in zip(compiled.result_types, attributes, strict=True)
            ]
        key_to_index = metadata._key_to_index  # pyright: ignore[reportPrivateUsage]
        rows = [_row(metadata, processors, key_to_index, record) for record in records]
        return DirectResult(rows, rowcount)

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
