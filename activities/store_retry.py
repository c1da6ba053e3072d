"""Ride out a store outage inside an activity: retry a transaction while the database is away, heartbeating.

Used for the store phases of the activities Temporal must not simply retry: the model activity (an attempt spent
on a database blink would be a paid model call lost, and five of them fail the turn) and the tool activity (an
at-most-once tool whose body ran must have its result recorded, never be run again). Each retried operation is one
whole transaction and idempotent, so running it again after a failure whose commit may have landed is safe.

The wait is bounded by the activity itself: its start-to-close timeout, and the turn's deadline, which cancels
the activity (the cancellation arrives through the heartbeats sent here).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from typing import TypeVar

from activities.heartbeat import heartbeating

__all__ = ["is_transient_store_error", "retry_store"]

T = TypeVar("T")

logger = logging.getLogger("turnkit.store")

INITIAL_DELAY = 0.2
MAXIMUM_DELAY = 5.0

# PostgreSQL SQLSTATEs that mean "try again": connection exceptions (class 08), the server shutting down or
# starting (57P01..57P03), and the concurrency failures a retry resolves (40001, 40P01).
_TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "40001", "40P01")
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
    }
)
_SQLITE_BUSY = ("database is locked", "database is busy", "database table is locked")


def is_transient_store_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or anything it wraps) says the database was unreachable or busy, not that the data was bad.

    Transient: refused/reset connections and other ``OSError``s, asyncpg connection and shutdown errors, SQLAlchemy
    errors on an invalidated connection or a pool timeout, PostgreSQL connection/shutdown SQLSTATEs, SQLite's
    "database is locked". Everything else (data, encoding, constraint errors) is not: retrying cannot fix it.
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


async def retry_store(operation: Callable[[], Awaitable[T]], *, what: str) -> T:
    """Run ``operation`` (one idempotent transaction) until it succeeds or fails for a non-transient reason.

    While the store is away the activity keeps heartbeating, so Temporal sees a live worker (and can cancel it).
    """
    delay = INITIAL_DELAY
    failures = 0
    async with heartbeating():
        while True:
            try:
                result = await operation()
            except Exception as err:
                if not is_transient_store_error(err):
                    raise
                failures += 1
                if failures == 1 or failures % 10 == 0:
                    logger.warning("store unavailable during %s (attempt %d), retrying: %s", what, failures, err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAXIMUM_DELAY)
                continue
            if failures:
                logger.info("store back for %s after %d failed attempts", what, failures)
            return result
