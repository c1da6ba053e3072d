"""PostgreSQL store transactions on connections kept checked out between them (CPU per turn, issue 37).

A store transaction on the direct path (``turnkit/store/postgres_direct.py``) used to take its connection from
SQLAlchemy's pool and give it back at its end: ``engine.connect()`` (a greenlet crossed, the pool's checkout and its
events, the isolation level set) and ``AsyncConnection.__aexit__`` (a task and a shield around ``close()``, the
pool's checkin and its events, the isolation level reset). That was 65-75 µs of the process's CPU per transaction
with nothing in it, and a turn of 8 tool calls runs 35 transactions that lock a row, one after another
(``bench/README.md``, "Connections kept between transactions").

Here a transaction that committed hands its connection to a short list of the event loop's, and the next
transaction takes it from there. What the pool's checkout and checkin did still happens, at most a
:data:`LEASE` later:

- **Recycling and invalidation.** A connection out of the pool for longer than :data:`LEASE` goes back to it when
  its transaction ends, and the next transaction checks one out: the pool's recycle rules and its replacement of the
  connections older than a lost one run at that checkout.
- **A lost connection.** When the pool invalidates any connection (the driver said it is gone: the database
  restarted or failed over), every connection kept at that moment goes back to the pool instead of serving the next
  transaction, where the checkout replaces those older than the failure; a transaction does not meet one dead kept
  connection after another.
- **The idle ping.** A connection kept idle for longer than ``IDLE_BEFORE_PING`` goes back to the pool marked with
  the time it was last used, so the checkout that follows pings it as it pings a connection idle in the pool
  (``turnkit/store/idle_ping.py``).
- **A failed transaction** (rolled back, or its COMMIT failed) gives its connection back to the pool, as before,
  whose checkin resets or discards it.

At most :data:`KEPT` connections are kept per event loop (fewer when the pool is smaller). They count as checked out
to the pool, which never opens more than its size and overflow allow. A connection no transaction took for a
:data:`LEASE` goes back to the pool on a timer, so that a process that went quiet holds open what the pool keeps and
no more: kept connections on top of the pool's own idle ones took a benchmark's five processes past PostgreSQL's
``max_connections``. :meth:`KeptConnections.close` gives them back (``Store.close()`` calls it before the pool is
disposed of).
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any, Final

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import QueuePool

from turnkit.store import idle_ping

_log = logging.getLogger(__name__)

__all__ = ["KEPT", "LEASE", "KeptConnections", "Lease"]

#: Connections kept per event loop at most: a worker's store transactions run a few at a time, each short.
KEPT: Final = 8
#: Seconds a connection may stay out of the pool before it goes back (its recycle and invalidation checks).
LEASE: Final = 1.0


class Lease:
    """A connection out of the pool for a store transaction: when it left the pool, and when it was last used."""

    __slots__ = ("connection", "generation", "idle_since", "taken_at")

    def __init__(self, connection: AsyncConnection, generation: int, taken_at: float) -> None:
        self.connection = connection
        #: :attr:`KeptConnections.generation` when it left the pool: an invalidation since retires it.
        self.generation = generation
        self.taken_at = taken_at
        self.idle_since = taken_at


class KeptConnections:
    """The connections kept between the direct path's transactions on ``engine`` (its pool), per event loop."""

    def __init__(self, engine: AsyncEngine, *, kept: int = KEPT) -> None:
        self._engine = engine
        pool = engine.pool
        self._limit = min(kept, pool.size()) if isinstance(pool, QueuePool) else kept
        self._kept: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Lease]] = weakref.WeakKeyDictionary()
        #: Counts the pool's invalidations: a lease taken before the last one goes back to the pool.
        self.generation = 0
        event.listen(engine.sync_engine, "invalidate", self._invalidated)
        #: The event loops whose kept connections a timer will look at (one timer per loop at a time).
        self._swept: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
        #: Connections on their way back to the pool from a timer (:meth:`close` waits for them).
        self._returning: set[asyncio.Task[None]] = set()

    def _invalidated(self, *_: Any) -> None:
        self.generation += 1

    async def take(self) -> Lease:
        """A connection for a transaction: the one kept last on this event loop when it may still serve, else one
        checked out of the pool."""
        kept = self._kept.get(asyncio.get_running_loop())
        now = time.monotonic()
        while kept:
            lease = kept.pop()
            if self._usable(lease, now):
                return lease
            await self._give_back(lease)
        return Lease(await self._engine.connect(), self.generation, now)

    async def end(self, lease: Lease, *, committed: bool) -> None:
        """The transaction on ``lease`` ended: keep its connection for the next one, or give it back to the pool
        (a transaction that did not commit, a lease past :data:`LEASE`, an invalidation since, a full list)."""
        now = time.monotonic()
        lease.idle_since = now
        if committed and self._usable(lease, now):
            loop = asyncio.get_running_loop()
            kept = self._kept.get(loop)
            if kept is None:
                kept = self._kept[loop] = []
            if len(kept) < self._limit:
                kept.append(lease)
                if loop not in self._swept:
                    self._swept.add(loop)
                    loop.call_later(LEASE, self._sweep, loop)
                return
        await self._give_back(lease)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        """Give the connections kept on ``loop`` that no transaction took for a :data:`LEASE` back to the pool; look
        again a lease later while any is kept."""
        self._swept.discard(loop)
        kept = self._kept.get(loop)
        if not kept:
            return
        now = time.monotonic()
        idle = [lease for lease in kept if now - lease.idle_since >= LEASE]
        if idle:
            kept[:] = [lease for lease in kept if now - lease.idle_since < LEASE]
            task = loop.create_task(self._give_back_quietly(idle))
            self._returning.add(task)
            task.add_done_callback(self._returning.discard)
        if kept:
            self._swept.add(loop)
            loop.call_later(LEASE, self._sweep, loop)

    async def _give_back_all(self, leases: list[Lease]) -> None:
        for lease in leases:
            await self._give_back(lease)

    async def _give_back_quietly(self, leases: list[Lease]) -> None:
        """:meth:`_give_back_all` from the timer, where nobody awaits it: a failure is logged (the pool discards a
        connection it could not take back)."""
        try:
            await self._give_back_all(leases)
        except Exception as error:
            _log.warning("a kept store connection could not be given back to the pool: %s", error)

    def _usable(self, lease: Lease, now: float) -> bool:
        connection = lease.connection
        return (
            lease.generation == self.generation
            and now - lease.taken_at <= LEASE
            and now - lease.idle_since <= idle_ping.IDLE_BEFORE_PING
            and not connection.closed
            and not connection.invalidated
        )

    async def _give_back(self, lease: Lease) -> None:
        """Return ``lease``'s connection to the pool, with the time it was last used (its next checkout pings it if
        that is long ago). Shielded, as ``AsyncConnection.__aexit__`` closes: a cancelled task still gives it back."""
        connection = lease.connection
        if not connection.closed and not connection.invalidated:
            idle_ping.mark_idle_since(connection.info, lease.idle_since)
        await asyncio.shield(connection.close())

    async def close(self) -> None:
        """Give every connection kept on this event loop back to the pool (before it is disposed of)."""
        kept = self._kept.pop(asyncio.get_running_loop(), [])
        await self._give_back_all(kept)
        loop = asyncio.get_running_loop()
        returning = [task for task in self._returning if task.get_loop() is loop]
        if returning:
            await asyncio.gather(*returning, return_exceptions=True)
