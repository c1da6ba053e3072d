"""Which store failures are deterministic (retrying cannot help) and which are transient (issue 8 items 1, 11).

A store activity retried under ``STORE_RETRY`` retries forever; that is right while the database is away, and wrong
when the database rejected a value: a NUL in a text column, a string longer than its column, NaN in JSON, a missing
required value. :func:`deterministic_store_error` tells the two apart from the real driver errors of SQLite
(``sqlite3``) and PostgreSQL (``asyncpg`` through SQLAlchemy), and :func:`store_failure_message` describes a
deterministic one briefly, **without** the SQL statement or any parameter value (both can hold user data and neither
belongs in a stored error or a workflow failure).

Transient, left to retry: lost or refused connections, serialization failures, deadlocks, ``database is locked``,
lock and statement timeouts, an administrator shutdown; anything not recognised as deterministic.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, ProgrammingError, StatementError

from turnkit.store.storable import UnstorableValue

__all__ = [
    "STORE_ERROR_TYPE",
    "STORE_UNAVAILABLE_TYPE",
    "deterministic_store_error",
    "sql_error",
    "store_failure_message",
    "transient_store_error",
    "unavailable_message",
]

#: The ``ApplicationError.type`` of a deterministic store failure (the turn fails with this class).
STORE_ERROR_TYPE: Final = "TurnKit::StoreError"
#: The ``ApplicationError.type`` of a transient store failure: retried; its message holds no SQL either.
STORE_UNAVAILABLE_TYPE: Final = "TurnKit::StoreUnavailable"

#: PostgreSQL SQLSTATE classes that a retry cannot change: data exceptions, integrity violations (races of
#: idempotent inserts are absorbed by the store's ``ON CONFLICT DO NOTHING`` before they get here), syntax or access
#: rules.
_DETERMINISTIC_CLASSES: Final = ("22", "23", "42")

#: Short descriptions of the SQLSTATEs a value can cause (the driver's own text may quote the value).
_SQLSTATE_NAMES: Final = {
    "22000": "invalid data",
    "22001": "a string is longer than its column",
    "22003": "a number is out of range",
    "22021": "a character the database cannot hold (NUL)",
    "22P02": "invalid text representation (NaN or infinity in JSON?)",
    "22P05": "a character the database cannot hold (NUL in JSON)",
    "23502": "a required value is missing",
    "23503": "a referenced record does not exist",
    "23505": "a unique value already exists",
    "23514": "a check constraint failed",
}

#: SQLite failures (``sqlite3.OperationalError`` and friends) whose message says a retry cannot help.
_SQLITE_DETERMINISTIC_MESSAGES: Final = ("too big", "constraint failed", "datatype mismatch", "no such")


def _sqlstate(err: BaseException) -> str | None:
    orig = getattr(err, "orig", None)
    for each in (orig, getattr(orig, "__cause__", None)):
        code = getattr(each, "sqlstate", None) or getattr(each, "pgcode", None)
        if isinstance(code, str) and len(code) == 5:
            return code
    return None


def deterministic_store_error(err: BaseException) -> bool:
    """Whether ``err``, raised by a store write, will be raised again by every retry of the same write.

    Args:
        err: An exception raised inside a store activity.

    Returns:
        True for errors caused by the values written (data, encoding, length, JSON, integrity); False for transient
        ones (connection, serialization, deadlock, lock, timeout) and for anything unrecognised.
    """
    if isinstance(err, UnstorableValue | UnicodeError):
        return True  # could not even be encoded for the driver
    if isinstance(err, DBAPIError):
        if err.connection_invalidated:
            return False
        code = _sqlstate(err)
        if code is not None:
            return code[:2] in _DETERMINISTIC_CLASSES
        orig = err.orig
        if isinstance(orig, sqlite3.IntegrityError | sqlite3.DataError | sqlite3.ProgrammingError):
            return True
        if isinstance(orig, sqlite3.OperationalError):
            message = str(orig).lower()
            return any(marker in message for marker in _SQLITE_DETERMINISTIC_MESSAGES)
        return isinstance(err, DataError | IntegrityError | ProgrammingError)
    if isinstance(err, StatementError):  # a value that failed before reaching the driver (a bind processor)
        return isinstance(err.orig, UnicodeError | ValueError | TypeError)
    return False


def store_failure_message(err: BaseException) -> str:
    """A short description of a deterministic store failure, without SQL text or parameter values."""
    if isinstance(err, UnstorableValue):
        return str(err)
    if isinstance(err, UnicodeError) or isinstance(getattr(err, "orig", None), UnicodeError):
        return "the store could not write a value: a string is not valid UTF-8 (a lone surrogate)"
    code = _sqlstate(err)
    if code is not None:
        what = _SQLSTATE_NAMES.get(code, "the database rejected a value")
        return f"the store could not write a value: {what} (SQLSTATE {code})"
    orig = getattr(err, "orig", None)
    if isinstance(orig, sqlite3.Error):
        # SQLite's messages name the constraint or the limit, never the value ("NOT NULL constraint failed: t.c").
        return f"the store could not write a value: {str(orig).splitlines()[0][:200]}"
    return f"the store could not write a value: {type(orig or err).__name__}"


def sql_error(err: BaseException) -> bool:
    """Whether ``err`` is a SQLAlchemy statement error, whose text embeds the SQL statement and its parameters."""
    return isinstance(err, StatementError)


def unavailable_message(err: BaseException) -> str:
    """A short description of a transient store failure (a lost connection, a lock, a timeout), without SQL."""
    orig = getattr(err, "orig", None) or err
    code = _sqlstate(err)
    first_line = (str(orig).splitlines() or [""])[0][:200]
    state = f" (SQLSTATE {code})" if code else ""
    return f"the store is unavailable: {type(orig).__name__}{state}: {first_line}"


# PostgreSQL SQLSTATEs that mean "try again": connection exceptions (class 08), the server shutting down or
# starting (57P01..57P03), the concurrency failures a retry resolves (40001, 40P01), and a server out of connections
# (53300: several processes whose pools together ask more than max_connections; one frees up soon). A paid model
# answer whose write met one of these is written once the server is back, not asked for again.
_TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "40001", "40P01", "53300")
_TRANSIENT_NAMES = frozenset(
    {
        "ConnectionDoesNotExistError",
        "CannotConnectNowError",
        "ConnectionFailureError",
        "ClientCannotConnectError",
        "ConnectionRejectionError",
        "AdminShutdownError",
        "CrashShutdownError",
        "DisconnectionError",
        "TooManyConnectionsError",
    }
)
_SQLITE_BUSY = ("database is locked", "database is busy", "database table is locked")


def transient_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything it wraps) says the database was unreachable or busy, not that the data was bad.

    Transient: refused/reset connections and other ``OSError``s, asyncpg connection and shutdown errors, SQLAlchemy
    errors on an invalidated connection or a pool timeout, PostgreSQL connection/shutdown SQLSTATEs (and a server out
    of connections), SQLite's "database is locked". Everything else (data, encoding, constraint errors) is not:
    retrying cannot fix it.
    """
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if _transient_here(current):
            return True
        for inner in (getattr(current, "orig", None), current.__cause__, current.__context__):
            if isinstance(inner, BaseException):
                pending.append(inner)
    return False


def _transient_here(exc: BaseException) -> bool:
    if isinstance(exc, OSError):  # ConnectionRefusedError, ConnectionResetError, TimeoutError, socket errors
        return True
    if getattr(exc, "connection_invalidated", False):  # SQLAlchemy: the connection died under the statement
        return True
    name = type(exc).__name__
    module = type(exc).__module__
    if name in _TRANSIENT_NAMES and module.startswith(("asyncpg", "sqlalchemy")):
        return True
    if name == "InterfaceError" and "closed" in str(exc):  # asyncpg (and its SQLAlchemy wrapper): connection closed
        return True
    if name == "TimeoutError" and module.startswith("sqlalchemy"):  # pool checkout timed out
        return True
    sqlstate = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None)
    if isinstance(sqlstate, str) and sqlstate.startswith(_TRANSIENT_SQLSTATES):
        return True
    if isinstance(exc, sqlite3.OperationalError) or name == "OperationalError":
        return any(marker in str(exc) for marker in _SQLITE_BUSY)
    return False
