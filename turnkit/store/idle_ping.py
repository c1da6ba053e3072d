"""Ping a pooled PostgreSQL connection before use only when it has been idle (CPU and round trips per turn, issue 9).

SQLAlchemy's ``pool_pre_ping`` pings on every checkout, and for asyncpg a ping is three round trips (``BEGIN``,
``;``, ``ROLLBACK``: the transaction is there for pgbouncer's transaction mode). A store transaction of one read was
six round trips, half of them the ping, and a one-iteration turn opens eleven.

A ping only guards the first statement on a connection that died while it sat in the pool (the database restarted
or failed over). A connection checked in a moment ago is as likely to die under its next statement as during a
ping, and that case is handled anyway: the driver's error marks the connection invalidated, SQLAlchemy drops every
pooled connection older than the failure, and the error is transient to TurnKit, so the transaction is run again
(``activities/store_retry.py`` in the activities, ``turnkit/store/patience.py`` on the client, Temporal's retry for
the store-only activities). So :func:`ping_when_idle` pings a connection only when it has been back in the pool for
longer than :data:`IDLE_BEFORE_PING`; a failed ping makes the pool open a new connection, as ``pool_pre_ping`` does.
The ping is the dialect's own (``Dialect.do_ping``, what ``pool_pre_ping`` runs).

The same checkout replaces a connection that comes back from the pool inside a transaction of the driver's. None
ever should: the store's direct path ends each transaction it sends to asyncpg (``turnkit/store/postgres_direct.py``)
or invalidates its connection, and the pool's own rollback at check-in cannot see that transaction (SQLAlchemy's
adapter is in autocommit for it).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["IDLE_BEFORE_PING", "mark_idle_since", "ping_when_idle"]

#: Seconds a connection may sit in the pool and still be used without a ping first.
IDLE_BEFORE_PING = 2.0

#: Where a pooled connection's record keeps the time it was last checked in (``ConnectionRecord.info`` lives as long
#: as the DBAPI connection: a new connection starts without it, and needs no ping).
_CHECKED_IN_AT = "turnkit_checked_in_at"
#: When a connection coming back to the pool was last used, if that was before its checkin (a connection the store kept
#: idle between transactions, ``turnkit/store/kept_connections.py``): its idle time counts from then.
_IDLE_SINCE = "turnkit_idle_since"


def mark_idle_since(info: dict[Any, Any], since: float) -> None:
    """Say in a connection's ``info`` that it has been idle since ``since`` (``time.monotonic()``), for its checkin."""
    info[_IDLE_SINCE] = since


def ping_when_idle(engine: AsyncEngine, *, idle: float | None = None) -> None:
    """Ping ``engine``'s pooled connections at checkout when they have been idle for more than ``idle`` seconds
    (:data:`IDLE_BEFORE_PING`, read at each checkout, when not given)."""

    @event.listens_for(engine.sync_engine, "checkin")
    def _checked_in(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            idle_since = record.info.pop(_IDLE_SINCE, None)
            record.info[_CHECKED_IN_AT] = time.monotonic() if idle_since is None else idle_since

    dialect = engine.dialect

    @event.listens_for(engine.sync_engine, "checkout")
    def _checked_out(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        in_transaction = getattr(record.driver_connection, "is_in_transaction", None)
        if in_transaction is not None and in_transaction():
            raise exc.DisconnectionError("a pooled connection came back inside a transaction: replaced")
        checked_in_at = record.info.get(_CHECKED_IN_AT)
        limit = IDLE_BEFORE_PING if idle is None else idle
        if checked_in_at is None or time.monotonic() - checked_in_at <= limit:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as err:
            # The pool discards this connection and checks out another (a new one when the database is back).
            raise exc.DisconnectionError(
                f"a pooled connection idle for over {limit:g} s failed its ping: {err}"
            ) from err
