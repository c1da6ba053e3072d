"""The store's prebuilt statements compiled once and run on the driver itself (CPU per turn, issue 9).

The store runs a few dozen prebuilt Core statements (``turnkit/store/statements.py``), over and over. Through
SQLAlchemy's execution path each execution rebuilt what never changes: the compiled cache's key, an execution context
(its parameters, its processors), a cursor wrapper and a ``CursorResult``; on PostgreSQL also a greenlet crossed twice
in SQLAlchemy's asyncio layer. Here a statement seen for the second time is compiled once for the store's dialect
(:class:`DirectStatements`), and each later execution does only what is left: its parameters through SQLAlchemy's own
bind processors, the driver's execute, its rows through SQLAlchemy's own result processors into SQLAlchemy ``Row``
objects. The SQL, the types and the rows are the ones SQLAlchemy's path gives.

The backends run it on their own connections: ``turnkit/store/postgres_direct.py`` (asyncpg) and
``turnkit/store/sqlite_inline.py`` (``sqlite3``). Each keeps SQLAlchemy's transactions, error handling and
``before_cursor_execute`` / ``after_cursor_execute`` events.

What goes to SQLAlchemy's own path: a statement seen for the first time (ad-hoc queries such as ``turnkit check``'s
are built anew each time and never compiled here), text SQL, statements whose values SQLAlchemy computes at
execution (Python-side column defaults), an INSERT whose generated key SQLAlchemy reads back by itself (implicit
RETURNING: the store asks for it explicitly instead, ``StoreTx._insert``), and everything while the engine echoes its
SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final, cast

from sqlalchemy.engine import Dialect, Row
from sqlalchemy.engine.result import SimpleResultMetaData
from sqlalchemy.exc import MultipleResultsFound
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Delete, Insert, Update
from sqlalchemy.sql.selectable import Select

__all__ = ["STATEMENTS_KEPT", "CompiledStatement", "DirectCursor", "DirectResult", "DirectStatements"]

#: Distinct statements a store compiles here; past it the cache starts again (the store's own are a few dozen).
STATEMENTS_KEPT: Final = 1_000
_DIRECT_KINDS: Final = (Select, Insert, Update, Delete)
#: ``Row(parent, processors, key_to_index, data)``: how SQLAlchemy's results make their rows (its typing shows only
#: the public side of ``Row``); the processors run in its compiled row code.
_row: Final = cast(Any, Row)


class CompiledStatement:
    """One statement compiled for the store's dialect with one set of parameter keys: its SQL and how to bind and read
    it."""

    __slots__ = (
        "compiled",
        "expands",
        "processors",
        "reads_last_row_id",
        "result_metadata",
        "result_processors",
        "result_types",
        "sql",
    )

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
        #: Read off the first execution's column types (asyncpg's NUMERIC processor depends on the type PostgreSQL
        #: sends): see :meth:`processors_for`.
        self.result_processors: list[Any] | None = None
        #: An INSERT that returns no rows: its generated key is the cursor's ``lastrowid`` (SQLite), as SQLAlchemy reads
        #: it for ``inserted_primary_key``.
        self.reads_last_row_id = bool(compiled.isinsert and not compiled.effective_returning)

    def processors_for(self, dialect: Dialect, type_codes: Sequence[Any] | None) -> list[Any]:
        """The result processors of each column, for the driver's ``type_codes`` of them (None: none needed)."""
        processors = self.result_processors
        if processors is None:
            codes = type_codes if type_codes is not None else [None] * len(self.result_types)
            processors = self.result_processors = [
                type_._cached_result_processor(dialect, code)  # pyright: ignore[reportPrivateUsage]
                for type_, code in zip(self.result_types, codes, strict=True)
            ]
        return processors

    def rows(self, dialect: Dialect, records: Sequence[Sequence[Any]], type_codes: Sequence[Any] | None) -> list[Any]:
        """SQLAlchemy ``Row`` objects of the driver's ``records``, through SQLAlchemy's own result processors."""
        metadata = self.result_metadata
        if metadata is None:
            return []
        processors = self.processors_for(dialect, type_codes)
        key_to_index = metadata._key_to_index  # pyright: ignore[reportPrivateUsage]
        return [_row(metadata, processors, key_to_index, record) for record in records]

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
        assert names is not None  # both dialects are positional: asyncpg's $1, $2, …; sqlite3's ?
        return sql, [processors[name](values[name]) if name in processors else values[name] for name in names]


class DirectStatements:
    """A store's statements compiled for the direct path (see the module docstring), shared by its transactions."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._compiled: dict[tuple[object, tuple[str, ...]], CompiledStatement | None] = {}
        self._seen: set[tuple[object, tuple[str, ...]]] = set()

    def compiled(self, statement: Executable, parameters: Mapping[str, Any]) -> CompiledStatement | None:
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
            self._seen.add(key)
            return None
        if len(self._compiled) >= STATEMENTS_KEPT:
            self._compiled.clear()
        compiled = statement.compile(dialect=self.dialect, column_keys=list(parameters))
        assert isinstance(compiled, SQLCompiler)
        self._compiled[key] = entry = None if _needs_context(compiled) else CompiledStatement(compiled)
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
    """What a ``before_cursor_execute`` or ``after_cursor_execute`` listener gets as the cursor of a direct statement on
    PostgreSQL (asyncpg has no cursor for it): its ``rowcount`` (set before ``after_cursor_execute``: rows written, or
    read by a SELECT, as PostgreSQL's command status says)."""

    __slots__ = ("rowcount",)

    def __init__(self) -> None:
        self.rowcount = -1


class DirectResult:
    """A direct statement's rows (SQLAlchemy ``Row`` objects, as a ``CursorResult`` yields) and its row count: the
    parts of ``CursorResult`` the store uses."""

    __slots__ = ("_rows", "inserted_primary_key", "rowcount")

    def __init__(
        self, rows: list[Row[Any]], rowcount: int, inserted_primary_key: tuple[Any, ...] | None = None
    ) -> None:
        self._rows = rows
        #: Rows written by an UPDATE or DELETE (or read by a SELECT on PostgreSQL), as the driver counts them.
        self.rowcount = rowcount
        #: An INSERT without RETURNING on SQLite: the new row's generated key (``cursor.lastrowid``).
        self.inserted_primary_key = inserted_primary_key

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
