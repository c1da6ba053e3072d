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

All of it is SQLAlchemy's public API (issue 37): the statement's ``compile()``, the compiler's ``bind_names``,
``positiontup``, ``construct_params`` and ``construct_expanded_state`` (IN lists), each type's ``dialect_impl()``
bind and result processors, ``sqlalchemy.engine.result_tuple`` for the rows, keyed as SQLAlchemy's own first run of
the statement keyed them (``CursorResult.keys()``: :meth:`DirectStatements.learn`), and ``DBAPIError.instance`` for
the errors (:func:`driver_error`).

What goes to SQLAlchemy's own path: a statement seen for the first time (ad-hoc queries such as ``turnkit check``'s
are built anew each time and never compiled here), text SQL, statements whose values SQLAlchemy computes at
execution (Python-side column defaults), an INSERT whose generated key SQLAlchemy reads back by itself (implicit
RETURNING: the store asks for it explicitly instead, ``StoreTx._insert``), and everything while the engine echoes its
SQL.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from sqlalchemy.engine import Connection, CursorResult, Dialect, Row, result_tuple
from sqlalchemy.exc import DBAPIError, MultipleResultsFound, StatementError
from sqlalchemy.sql.base import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.dml import Delete, Insert, Update
from sqlalchemy.sql.selectable import Select
from sqlalchemy.types import TupleType, TypeEngine

__all__ = [
    "STATEMENTS_KEPT",
    "CompiledStatement",
    "DirectCursor",
    "DirectResult",
    "DirectStatements",
    "driver_error",
]

#: Distinct statements a store compiles here; past it the cache starts again (the store's own are a few dozen).
STATEMENTS_KEPT: Final = 1_000
_DIRECT_KINDS: Final = (Select, Insert, Update, Delete)

#: One statement's key in :class:`DirectStatements`: the statement and its parameters' keys.
_Key = tuple[object, tuple[str, ...]]
#: A result column's index and its processor.
_Processor = tuple[int, Callable[[Any], Any]]


class CompiledStatement:
    """One statement compiled for the store's dialect with one set of parameter keys: its SQL and how to bind and read
    it (SQLAlchemy's own bind and result processors, SQLAlchemy ``Row`` objects with the keys its path gives them)."""

    __slots__ = (
        "compiled",
        "expanded_plans",
        "expands",
        "list_keys",
        "make_row",
        "parameter_keys",
        "plan",
        "processors",
        "reads_last_row_id",
        "result_processors",
        "result_types",
        "returns_rows",
        "sql",
    )

    def __init__(
        self,
        compiled: SQLCompiler,
        dialect: Dialect,
        keys: Sequence[str],
        result_types: Sequence[TypeEngine[Any]],
        parameter_keys: Sequence[str],
    ) -> None:
        self.compiled = compiled
        self.sql = compiled.string
        #: IN lists given as one list parameter (``bindparam(…, expanding=True)``, or a literal list): the SQL depends
        #: on their lengths (``SQLCompiler.construct_expanded_state`` renders it for each execution).
        self.expands = bool(compiled.post_compile_params or compiled.literal_execute_params)
        #: Bind processors by parameter name: each bound type's own, for the dialect.
        self.processors: Mapping[str, Callable[[Any], Any]] = {
            name: process
            for bindparam, name in compiled.bind_names.items()
            if bindparam not in compiled.literal_execute_params
            and (process := bindparam.type.dialect_impl(dialect).bind_processor(dialect)) is not None
        }
        self.result_types = list(result_types)
        #: Whether the statement returns rows (a SELECT, or a write with RETURNING).
        self.returns_rows = bool(keys)
        #: Makes a ``Row`` of one record's values, with ``keys``.
        self.make_row = result_tuple(list(keys)) if keys else None
        #: ``(column index, processor)`` of the columns that have a result processor, read off the first execution's
        #: column types (asyncpg's NUMERIC processor depends on the type PostgreSQL sends): see :meth:`processors_for`.
        self.result_processors: list[_Processor] | None = None
        #: An INSERT that returns no rows: its generated key is the cursor's ``lastrowid`` (SQLite), as SQLAlchemy reads
        #: it for ``inserted_primary_key``.
        self.reads_last_row_id = bool(compiled.isinsert and not compiled.effective_returning)
        #: The keys of the parameters it runs with (a statement is compiled once per set of keys).
        self.parameter_keys = tuple(parameter_keys)
        #: Where each positional argument comes from, for those parameter keys (None: SQLAlchemy's
        #: ``construct_params`` builds the arguments at each execution); see :func:`_plan`.
        self.plan = None if self.expands else _plan(compiled, self.parameter_keys, self.processors)
        #: An IN-list statement's SQL and plan by the lengths of its lists, which alone decide its SQL (None:
        #: SQLAlchemy's ``construct_expanded_state`` renders it at each execution).
        self.expanded_plans: dict[tuple[int, ...], tuple[str, _Plan] | None] = {}
        #: The parameter keys of an IN-list statement whose values are lists (None: no IN list, or a literal-rendered
        #: parameter, whose SQL depends on its values).
        self.list_keys = (
            _list_keys(compiled, self.parameter_keys) if self.expands and not compiled.literal_execute_params else None
        )

    def processors_for(self, dialect: Dialect, type_codes: Sequence[Any] | None) -> list[_Processor]:
        """The result processors of the columns that have one, for the driver's ``type_codes`` of them (None: none
        needed): each column type's own, for the dialect."""
        processors = self.result_processors
        if processors is None:
            codes = type_codes if type_codes is not None else [None] * len(self.result_types)
            processors = self.result_processors = [
                (index, process)
                for index, (type_, code) in enumerate(zip(self.result_types, codes, strict=True))
                if (process := type_.dialect_impl(dialect).result_processor(dialect, code)) is not None
            ]
        return processors

    def rows(self, dialect: Dialect, records: Sequence[Sequence[Any]], type_codes: Sequence[Any] | None) -> list[Any]:
        """SQLAlchemy ``Row`` objects of the driver's ``records``, through SQLAlchemy's own result processors."""
        make_row = self.make_row
        if make_row is None:
            return []
        processors = self.processors_for(dialect, type_codes)
        if not processors:
            return [make_row(record) for record in records]
        rows: list[Any] = []
        for record in records:
            values = list(record)
            for index, process in processors:
                values[index] = process(values[index])
            rows.append(make_row(values))
        return rows

    def arguments(self, parameters: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SQL to send and its positional arguments, for ``parameters`` (with the keys it was compiled for)."""
        plan = self.plan
        if plan is None and self.list_keys is not None:
            planned = self._expanded_plan(parameters, self.list_keys)
            if planned is not None:
                sql, plan = planned
                return sql, _arguments(plan, parameters)
        if plan is not None:
            return self.sql, _arguments(plan, parameters)
        return self._constructed(parameters)

    def _expanded_plan(self, parameters: Mapping[str, Any], list_keys: tuple[str, ...]) -> tuple[str, _Plan] | None:
        """The SQL and plan of an IN-list statement for the lengths of ``parameters``' lists (None: no plan)."""
        lengths: list[int] = []
        for key in list_keys:
            value = parameters[key]
            if not isinstance(value, (list, tuple)):  # a set or an iterator: SQLAlchemy's path takes it as it is
                return None
            lengths.append(len(value))  # pyright: ignore[reportUnknownArgumentType]
        shape = tuple(lengths)
        try:
            return self.expanded_plans[shape]
        except KeyError:
            pass
        probe: dict[str, Any] = {key: _Marker(key) for key in self.parameter_keys}
        for key, length in zip(list_keys, shape, strict=True):
            probe[key] = [_Marker(key, index) for index in range(length)]
        try:
            expanded = self.compiled.construct_expanded_state(probe, escape_names=False)
        except Exception:  # SQLAlchemy's path raises it, with its own message, at each execution
            entry = None
        else:
            names = expanded.positiontup
            assert names is not None  # both dialects are positional
            processors = {**self.processors, **expanded.processors}
            planned = _plan_of(names, expanded.parameters, processors, self.compiled)
            entry = None if planned is None else (expanded.statement, planned)
        if len(self.expanded_plans) >= _SHAPES_KEPT:
            self.expanded_plans.clear()
        self.expanded_plans[shape] = entry
        return entry

    def _constructed(self, parameters: Mapping[str, Any]) -> tuple[str, list[Any]]:
        """The SQL and arguments as SQLAlchemy's ``construct_params`` (or ``construct_expanded_state``) builds them."""
        compiled = self.compiled
        processors = self.processors
        if self.expands:
            expanded = compiled.construct_expanded_state(parameters, escape_names=False)
            values = expanded.parameters
            processors = {**processors, **expanded.processors}
            sql, names = expanded.statement, expanded.positiontup
        else:
            values = compiled.construct_params(parameters, escape_names=False)
            sql, names = self.sql, compiled.positiontup
        assert names is not None  # both dialects are positional: asyncpg's $1, $2, …; sqlite3's ?
        return sql, [processors[name](values[name]) if name in processors else values[name] for name in names]


class _Marker:
    """A probe's stand-in for a parameter's value (or the ``index``-th item of its list): where SQLAlchemy puts it
    tells which positional argument it becomes (:func:`_plan`)."""

    __slots__ = ("index", "key")

    def __init__(self, key: str, index: int | None = None) -> None:
        self.key = key
        self.index = index


#: Where one positional argument comes from: ``(parameter key, list index or None, constant, bind processor)``; a
#: constant (a value bound in the statement itself) when the key is None.
_Source = tuple[str | None, int | None, Any, Callable[[Any], Any] | None]
_Plan = tuple[_Source, ...]
#: IN-list shapes (the lengths of a statement's lists) planned per statement; past it the plans start again.
_SHAPES_KEPT: Final = 64


def _plan(
    compiled: SQLCompiler, parameter_keys: Sequence[str], processors: Mapping[str, Callable[[Any], Any]]
) -> _Plan | None:
    """Where each positional argument of ``compiled`` comes from when it runs with ``parameter_keys``, found by asking
    SQLAlchemy's own ``construct_params`` once with a marker per key. None when a value is computed at each execution
    (a bound callable) or the probe fails (a required parameter missing: SQLAlchemy's path raises its error)."""
    try:
        values = compiled.construct_params({key: _Marker(key) for key in parameter_keys}, escape_names=False)
    except Exception:  # SQLAlchemy's path raises it, with its own message, at each execution
        return None
    names = compiled.positiontup
    assert names is not None  # both dialects are positional
    return _plan_of(names, values, processors, compiled)


def _plan_of(
    names: Sequence[str],
    values: Mapping[str, Any],
    processors: Mapping[str, Callable[[Any], Any]],
    compiled: SQLCompiler,
) -> _Plan | None:
    """The plan of positional ``names`` whose probed ``values`` are markers or constants."""
    if any(bindparam.callable is not None for bindparam in compiled.bind_names):
        return None
    plan: list[_Source] = []
    for name in names:
        value = values[name]
        process = processors.get(name)
        if isinstance(value, _Marker):
            plan.append((value.key, value.index, None, process))
        elif isinstance(value, (list, tuple)) and any(isinstance(item, _Marker) for item in value):  # pyright: ignore[reportUnknownVariableType]
            return None  # a list bound as one argument (an array): SQLAlchemy's path binds it
        else:
            plan.append((None, None, value, process))
    return tuple(plan)


def _arguments(plan: _Plan, parameters: Mapping[str, Any]) -> list[Any]:
    """The positional arguments of ``parameters`` by ``plan``, each through its bind processor."""
    arguments: list[Any] = []
    for key, index, constant, process in plan:
        if key is None:
            value = constant
        elif index is None:
            value = parameters[key]
        else:
            value = parameters[key][index]
        arguments.append(value if process is None else process(value))
    return arguments


def _list_keys(compiled: SQLCompiler, parameter_keys: Sequence[str]) -> tuple[str, ...]:
    """The parameter keys an IN-list statement takes as lists: those of its expanding parameters."""
    expanding = {bindparam.key for bindparam in compiled.post_compile_params}
    expanding |= {name for bindparam in compiled.post_compile_params if (name := compiled.bind_names.get(bindparam))}
    return tuple(key for key in parameter_keys if key in expanding)


class DirectStatements:
    """A store's statements compiled for the direct path (see the module docstring), shared by its transactions."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._compiled: dict[_Key, CompiledStatement | None] = {}
        #: Statements seen on SQLAlchemy's path, with the keys of their rows once it has run them (None until then).
        self._seen: dict[_Key, tuple[str, ...] | None] = {}
        #: Raised when the database said a prepared statement's plan no longer fits its schema (PostgreSQL, after DDL):
        #: each connection then prepares its statements anew (``turnkit/store/postgres_direct.py``).
        self.generation = 0

    def compiled(self, statement: Executable, parameters: Mapping[str, Any]) -> CompiledStatement | None:
        """``statement`` compiled for ``parameters``' keys, or None: SQLAlchemy's own path runs it (a first sight, or
        a statement the direct path does not take); then :meth:`learn` its result."""
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
            self._seen[key] = None
            return None
        keys = self._seen[key]
        if keys is None:  # SQLAlchemy's path has not run it to the end (it raised)
            if statement.exported_columns:  # its rows' keys are SQLAlchemy's to tell: its path runs it again
                return None
            keys = ()  # it returns no rows
        if len(self._compiled) >= STATEMENTS_KEPT:
            self._compiled.clear()
        self._compiled[key] = entry = _compile(statement, list(parameters), self.dialect, keys)
        return entry

    def learn(self, statement: Executable, parameters: Mapping[str, Any] | None, result: CursorResult[Any]) -> None:
        """After SQLAlchemy's path ran ``statement`` (seen for the first time): the keys of its rows, as SQLAlchemy
        names them (an unlabelled ``max(x)`` is ``max_1``), which the statement's rows keep on the direct path."""
        key = (statement, tuple(parameters or ()))
        if key in self._seen and self._seen[key] is None:
            self._seen[key] = tuple(result.keys()) if result.returns_rows else ()


def _compile(
    statement: Executable, keys: list[str], dialect: Dialect, row_keys: tuple[str, ...]
) -> CompiledStatement | None:
    """``statement`` compiled for ``dialect`` with the parameter ``keys``, its rows keyed ``row_keys``; None when only
    SQLAlchemy's execution context can run it."""
    assert isinstance(statement, _DIRECT_KINDS)
    compiled = statement.compile(dialect=dialect, column_keys=keys)
    assert isinstance(compiled, SQLCompiler)
    if _needs_context(compiled):
        return None
    columns = list(statement.exported_columns) if row_keys else []
    if len(columns) != len(row_keys):  # not the columns SQLAlchemy read: leave it to its path
        return None
    return CompiledStatement(compiled, dialect, row_keys, [column.type for column in columns], keys)


def _needs_context(compiled: SQLCompiler) -> bool:
    """Whether only SQLAlchemy's execution context can run ``compiled``: values computed at execution (Python-side
    defaults), a generated key it reads back by itself, a schema translation, a tuple bound as one parameter."""
    return bool(
        compiled.insert_prefetch
        or compiled.update_prefetch
        or compiled.implicit_returning
        or compiled.schema_translate_map
        or any(isinstance(bindparam.type, TupleType) for bindparam in compiled.bind_names)
    )


def driver_error(
    connection: Connection, error: Exception, sql: str, arguments: Sequence[Any], *, disconnect: bool
) -> BaseException:
    """What SQLAlchemy's execution raises for ``error``, a driver's exception (of the dialect's DBAPI module) raised by
    a statement of the direct path: ``sqlalchemy.exc.DBAPIError.instance`` picks the same ``sqlalchemy.exc`` class
    (``IntegrityError``, ``OperationalError``…, ``StatementError`` for an exception that is no DBAPI error) with
    ``connection_invalidated`` set on a lost connection (``disconnect``). A ``sqlalchemy.exc`` error is itself."""
    if isinstance(error, StatementError):
        return error
    dialect = connection.dialect
    return DBAPIError.instance(
        sql,
        list(arguments),
        error,
        dialect.loaded_dbapi.Error,
        hide_parameters=connection.engine.hide_parameters,
        connection_invalidated=disconnect,
        dialect=dialect,
        ismulti=False,
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
