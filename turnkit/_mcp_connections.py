"""Connections to an MCP server kept open between its listings and calls (``MCPServer(keep_alive=...)``).

Opening a connection to a stdio server starts its process and its handshake: 0.6 to 0.8 s for a Python server built
with the MCP SDK, where a call on an open connection takes a few milliseconds. So a worker keeps the connections it
opened for ``keep_alive`` seconds after their last use, and a worker that stops closes them
(:func:`close_kept_connections`, from ``TurnKitPlugin.run_worker``). Each connection carries one listing or call at a
time: a call never waits behind another one, and calls run side by side in as many server processes as before.

A connection is owned by a task of its own. The MCP SDK's ``Client`` must be entered and exited in one task (anyio's
cancel scopes require it), while the activities that use it run in theirs; the owner task starts in an empty
context, so no activity's context outlives the activity in it. A connection whose use raised is closed, never kept:
what state a failed or cancelled request left it in is unknown.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncGenerator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mcp import Client

__all__ = ["MAX_IDLE", "KeptConnections", "close_kept_connections"]

logger = logging.getLogger("turnkit.mcp")

#: Every open set of kept connections, so that a worker that stops closes those of its event loop.
_OPEN: set[KeptConnections] = set()

#: Idle connections kept per server and event loop at most. A burst of calls at once opens one connection (a stdio
#: server: a process) per call; after it, the connections beyond these close instead of idling for ``keep_alive``.
MAX_IDLE: Final = 16


class _Connection:
    """One connected ``mcp.Client``, held open by its owner task until :meth:`close`."""

    def __init__(self, factory: Callable[[], AbstractAsyncContextManager[Client]], name: str) -> None:
        self._factory = factory
        self._name = name
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.client: Client | None = None
        #: Closes the connection once it has been idle for the pool's ``keep_alive``.
        self.expiry: asyncio.TimerHandle | None = None

    async def open(self) -> Client:
        """Connect (the owner task enters the client); raises what connecting raised."""
        loop = asyncio.get_running_loop()
        connected: asyncio.Future[Client] = loop.create_future()
        self._task = loop.create_task(
            self._own(connected), name=f"turnkit MCP connection {self._name}", context=contextvars.Context()
        )
        try:
            client: Client = await asyncio.shield(connected)
        except BaseException:
            self._task.cancel()  # connecting, or cancelled while it did: the owner leaves the client at once
            raise
        self.client = client
        return client

    async def _own(self, connected: asyncio.Future[Client]) -> None:
        try:
            async with self._factory() as client:
                if connected.cancelled():
                    return
                connected.set_result(client)
                await self._stop.wait()
        except asyncio.CancelledError:
            if not connected.done():
                connected.cancel()
        except Exception as err:
            if not connected.done():
                connected.set_exception(err)
            else:  # the connection was in use or idle: its users saw the failure, or will see the closed client
                logger.debug("a kept connection to MCP server %s ended: %s", self._name, err)

    @property
    def alive(self) -> bool:
        """Whether its owner task still holds the client (a client that failed ends it; a lost peer may not)."""
        return self._task is not None and not self._task.done()

    async def close(self) -> None:
        """Leave the client (a stdio server's process ends with it) and wait until that is done."""
        if self.expiry is not None:
            self.expiry.cancel()
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


class KeptConnections:
    """The connections to one MCP server on one event loop; idle ones wait ``keep_alive`` seconds for their next use
    (0: each is closed after its one use)."""

    def __init__(
        self, factory: Callable[[], AbstractAsyncContextManager[Client]], name: str, keep_alive: float
    ) -> None:
        self._factory = factory
        self._name = name
        self._keep_alive = keep_alive
        self._loop = asyncio.get_running_loop()
        self._idle: list[_Connection] = []
        self._closing: set[asyncio.Task[None]] = set()
        self.closed = False
        _OPEN.add(self)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop its connections belong to."""
        return self._loop

    @asynccontextmanager
    async def connection(self, *, fresh: bool = False) -> AsyncGenerator[tuple[Client, bool]]:
        """A connected client for one listing or call, and whether it was used before (False: opened now; ``fresh``
        always opens one). It is kept for the next use when the block ends normally, and closed when it raises.

        Raises:
            Exception: What connecting raised (nothing was sent).
        """
        connection = None if fresh else self._take_idle()
        reused = connection is not None
        if connection is None:
            connection = _Connection(self._factory, self._name)
            await connection.open()
        assert connection.client is not None
        kept = False
        try:
            yield connection.client, reused
            kept = self._keep_alive > 0 and not self.closed and len(self._idle) < MAX_IDLE
        finally:
            if kept:
                connection.expiry = self._loop.call_later(self._keep_alive, self._expire, connection)
                self._idle.append(connection)
            else:
                self._close_later(connection)

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()  # the most recently used: the others may expire
            if connection.expiry is not None:
                connection.expiry.cancel()
                connection.expiry = None
            if connection.alive:
                return connection
            self._close_later(connection)  # its client failed while it waited
        return None

    def _expire(self, connection: _Connection) -> None:
        if connection in self._idle:
            self._idle.remove(connection)
            self._close_later(connection)

    def _close_later(self, connection: _Connection) -> None:
        """Close ``connection`` without making its last user wait (a stdio server may take a moment to end)."""
        task = self._loop.create_task(connection.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Close the idle connections, and every one in use once its use ends; wait until they are closed."""
        self.closed = True
        _OPEN.discard(self)
        while self._idle:
            self._close_later(self._idle.pop())
        await asyncio.gather(*self._closing, return_exceptions=True)


async def close_kept_connections() -> None:
    """Close the kept MCP connections of the running event loop (a worker that stops; see the module docstring)."""
    loop = asyncio.get_running_loop()
    for kept in list(_OPEN):
        if kept.loop.is_closed():  # a loop that ended without closing them: nothing is left to close on it
            _OPEN.discard(kept)
    await asyncio.gather(*(kept.aclose() for kept in list(_OPEN) if kept.loop is loop))
