"""The TurnKit store (behaviour §2.9) on SQLAlchemy's async engine: SQLite (embedded default) or PostgreSQL.

Two rules hold for every write here:

* **Idempotent creates.** Records are created by natural key (a caller-chosen id, ``(turn_id, tool_call_id)``, a
  delivery ``key``); creating again returns the existing row, so a retried or zombie activity cannot duplicate.
* **Compare-and-set status changes.** ``claim_turn`` / ``claim_tool_execution`` are ``UPDATE … WHERE status IN
  (from)`` and report whether they won, so a late writer can never overwrite a newer state.

``Store.atomic()`` opens one transaction (a :class:`StoreTx`) and can take row locks: the conversation row
(message sequences, the lane) and the root turn row (root-tree budgets). On PostgreSQL those are ``SELECT … FOR
UPDATE``; on SQLite every write transaction is ``BEGIN IMMEDIATE``, which serialises writers database-wide.

A transaction's operations are in ``turnkit/store/tx/``, one module per record (``StoreTx`` is all of them). The
statements are in ``turnkit/store/statements.py``, a row's values in and out (records of rows, new rows, their
checks) in ``turnkit/store/rows.py``, and the engine a store opens in ``turnkit/store/engine.py``.
"""

from __future__ import annotations

import contextvars
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final

from sqlalchemy.engine import Engine, Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from turnkit.kernel.records import ConversationRecord, MessageRecord, ToolExecutionRecord, TurnRecord
from turnkit.store.direct import DirectStatements
from turnkit.store.engine import sqlite_file, store_engine
from turnkit.store.kept_connections import KeptConnections
from turnkit.store.rows import NewMessage, media_id_for, utcnow
from turnkit.store.sqlite_inline import InlineSQLite
from turnkit.store.tx.base import Look, StoreConnection
from turnkit.store.tx.conversations import ConversationsTx
from turnkit.store.tx.deliveries import DeliveriesTx
from turnkit.store.tx.media import MediaTx
from turnkit.store.tx.staged_inputs import StagedInputsTx
from turnkit.store.tx.tool_executions import ToolExecutionsTx
from turnkit.store.tx.turns import OutsideLane
from turnkit.store.tx.waits import WaitsTx

if TYPE_CHECKING:
    # asyncpg (the `postgres` extra) is imported by a store on PostgreSQL only: SQLite needs no PostgreSQL driver.
    from turnkit.store.postgres_direct import DirectConnection

__all__ = [
    "DEFAULT_DATABASE_URL",
    "KeptRows",
    "Look",
    "NewMessage",
    "OutsideLane",
    "Store",
    "StoreTx",
    "in_transaction",
    "media_id_for",
    "utcnow",
]

DEFAULT_DATABASE_URL: Final = "sqlite+aiosqlite:///.turnkit/turnkit.db"
#: How many conversation rows a store keeps in memory for later reads (Store.conversation_rows): about 1 KB each.
CONVERSATIONS_KEPT: Final = 10_000


# The transaction of the current task, so that nested ``atomic()`` calls join it (behaviour §2.9: re-entrant).
_current_tx: contextvars.ContextVar[StoreTx | None] = contextvars.ContextVar("turnkit_store_tx", default=None)


def in_transaction() -> bool:
    """Whether the current task is inside a store transaction (application callbacks must never run there)."""
    return _current_tx.get() is not None


@asynccontextmanager
async def _autocommitted(store: Store, engine: AsyncEngine) -> AsyncGenerator[StoreTx, None]:
    """A StoreTx whose statements each commit alone (``engine`` in autocommit)."""
    async with engine.connect() as connection:
        yield StoreTx(store, store.direct_connection(connection))


class KeptRows:
    """Committed rows that never change once written, kept in memory by ``uid`` for later reads; past ``limit`` the
    least recently used goes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._rows: OrderedDict[str, Row[Any]] = OrderedDict()

    def get(self, uid: str) -> Row[Any] | None:
        """The kept row of ``uid``, or None."""
        row = self._rows.get(uid)
        if row is not None:
            self._rows.move_to_end(uid)
        return row

    def keep(self, row: Row[Any]) -> None:
        """Keep ``row`` (committed, and never to change) under its ``uid``."""
        self._rows[row.uid] = row
        self._rows.move_to_end(row.uid)
        if len(self._rows) > self.limit:
            self._rows.popitem(last=False)

    def __len__(self) -> int:
        return len(self._rows)


class Store:
    """An async SQL store for TurnKit records. Create with :meth:`open`; close with :meth:`close`."""

    def __init__(self, engine: AsyncEngine, inline: InlineSQLite | None = None, *, direct: bool = True) -> None:
        self.engine = engine
        #: On a SQLite file in WAL mode (unless ``sqlite_inline=False``): the store's transactions, run on SQLAlchemy's
        #: synchronous engine on the event loop's thread (``turnkit/store/sqlite_inline.py``). ``engine`` still serves
        #: the migrations and direct uses of it.
        self.inline = inline
        # PostgreSQL: the same pool, its connections in autocommit, for reads that need no transaction (Store.reads).
        postgresql = engine.dialect.name == "postgresql"
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT") if postgresql else None
        #: PostgreSQL (unless ``direct=False``): the store's prebuilt statements, compiled once and sent straight to
        #: asyncpg (``turnkit/store/direct.py``, ``postgres_direct.py``). The inline SQLite path has its own.
        self.direct = DirectStatements(engine.dialect) if postgresql and direct and not engine.echo else None
        self._prepared_kept = 0
        #: The direct path's connection class (:class:`~turnkit.store.postgres_direct.DirectConnection`), imported here:
        #: it needs asyncpg, which a store on SQLite does without (the `postgres` extra).
        self._direct_connection: type[DirectConnection] | None = None
        #: The direct path's connections: the same pool's, in autocommit for SQLAlchemy, whose BEGIN, COMMIT and
        #: ROLLBACK :class:`DirectConnection` sends to asyncpg itself (``turnkit/store/postgres_direct.py``), kept
        #: checked out between transactions (``turnkit/store/kept_connections.py``).
        self._kept: KeptConnections | None = None
        if self.direct is not None:
            from turnkit.store import postgres_direct

            self._direct_connection = postgres_direct.DirectConnection
            self._prepared_kept = postgres_direct.prepared_statements_kept(engine.url)
            options = {postgres_direct.DRIVER_TRANSACTION: True}
            self._kept = KeptConnections(engine.execution_options(isolation_level="AUTOCOMMIT", **options))
        #: Committed conversation rows this store has read. A conversation row is never updated or deleted once
        #: committed, so every later read of it may take it from here (StoreTx.load_conversation): a model call's
        #: prompt shows the conversation's subject, read once per conversation instead of once per call (issue 9).
        self.conversation_rows = KeptRows(CONVERSATIONS_KEPT)
        self._closers: list[Callable[[], Awaitable[None]]] = []

    def on_close(self, closer: Callable[[], Awaitable[None]]) -> None:
        """Run ``closer`` when the store closes, before its pools are disposed of (what holds a connection of the
        pool beyond a transaction, such as the live transport's listener, gives it back there)."""
        self._closers.append(closer)

    @property
    def sync_engines(self) -> tuple[Engine, ...]:
        """The synchronous engines whose events see the store's statements (for counting them): the async engine's,
        and the inline SQLite engine's when there is one."""
        engines: tuple[Engine, ...] = (self.engine.sync_engine,)
        return engines if self.inline is None else (*engines, self.inline.engine)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    @classmethod
    async def open(
        cls,
        url: str | None = None,
        *,
        migrate: bool = True,
        echo: bool = False,
        sqlite_inline: bool = True,
        direct: bool = True,
    ) -> Store:
        """Connect to ``url`` (default: a SQLite file under ``./.turnkit/``) and bring its schema up to date.

        ``sqlite_inline=False`` sends every SQLite statement to aiosqlite's thread instead of running the store's
        transactions on SQLAlchemy's synchronous engine on the event loop's thread (``turnkit/store/sqlite_inline.py``;
        no effect on PostgreSQL, an in-memory database or a file system that refuses WAL).
        ``direct=False`` runs every statement through SQLAlchemy's execution path instead of running the store's
        prebuilt statements, compiled once, on the driver itself (``turnkit/store/direct.py``; asyncpg, or ``sqlite3``
        on the inline path).
        """
        url = url or DEFAULT_DATABASE_URL
        engine = store_engine(url, echo=echo)
        store = cls(engine, direct=direct)
        if migrate:
            await store.migrate()
        path = sqlite_file(url) if sqlite_inline else None
        if path is not None:
            store.inline = InlineSQLite.open(path, echo=echo, direct=direct)
        return store

    async def close(self) -> None:
        """Dispose of the connection pools."""
        closers, self._closers = self._closers, []
        for closer in closers:
            await closer()
        if self.inline is not None:
            await self.inline.close()
        if self._kept is not None:
            await self._kept.close()
        await self.engine.dispose()

    async def migrate(self) -> None:
        """Run the Alembic migrations up to head (safe to call from several processes at once)."""
        from turnkit.store.migrate import upgrade_to_head

        async with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                # Several processes (worker, app, tests) may migrate at once: serialise them.
                await conn.exec_driver_sql("SELECT pg_advisory_xact_lock(1414876748)")
            await conn.run_sync(upgrade_to_head)

    @asynccontextmanager
    async def atomic(
        self,
        *,
        conversation_id: str | None = None,
        turn_id: str | None = None,
        wait_graph: bool = False,
        look: Look | None = None,
    ) -> AsyncGenerator[StoreTx, None]:
        """One transaction, optionally locking a conversation row and/or a turn row.

        ``wait_graph=True`` first takes the store-wide wait-graph lock (behaviour §2.9 ``atomic_graph``): a transaction
        that may add wait edges must take it before any row lock, so that lock order is the same everywhere.

        ``look`` (with ``turn_id``): what the transaction reads next, read with the turn's lock (:class:`Look`).

        Re-entrant: inside another ``atomic()`` of the same task, the outer transaction is joined (and the extra
        locks are taken in it). An exception rolls back every write made inside the outermost block.
        """
        outer = _current_tx.get()
        if outer is not None:
            await outer.lock(conversation_id=conversation_id, turn_id=turn_id)  # its reads answer as they come
            yield outer
            return
        async with self._transaction() as connection:
            tx = StoreTx(self, connection)
            token = _current_tx.set(tx)
            try:
                if wait_graph:
                    await tx.lock_wait_graph()
                await tx.lock(conversation_id=conversation_id, turn_id=turn_id, look=look)
                yield tx
            finally:
                _current_tx.reset(token)
        # Committed (a rollback raised above and skips this): what waited for the commit runs now, outside any
        # transaction (lifecycle events, docs/design.md "Events: after the commit, once").
        for callback in tx.committed_callbacks:
            await callback()

    @asynccontextmanager
    async def _transaction(self) -> AsyncGenerator[StoreConnection, None]:
        """A new transaction's connection: inline on a SQLite file (``turnkit/store/sqlite_inline.py``), else a Core
        connection of the async engine. Not an ORM session: the store runs prebuilt Core statements only, and the
        session's layer cost ~45 µs of CPU per transaction and ~8 µs per statement (bench/README.md, "seventh
        pass")."""
        if self.inline is not None:
            async with self.inline.transaction() as inline:
                yield inline
            return
        if self.direct is None:
            async with self.engine.connect() as connection, connection.begin():
                yield connection
            return
        assert self._kept is not None and self._direct_connection is not None
        lease = await self._kept.take()
        try:
            direct = self._direct_connection(lease.connection, self.direct, self._prepared_kept)
            direct.begin()
            try:
                yield direct
            except BaseException:
                await direct.rollback()
                raise
            await direct.commit()
        except BaseException:
            await self._kept.end(lease, committed=False)
            raise
        await self._kept.end(lease, committed=True)

    def direct_connection(self, connection: AsyncConnection) -> DirectConnection | AsyncConnection:
        """``connection`` (in autocommit) with the store's prebuilt statements sent straight to asyncpg, on PostgreSQL
        (``turnkit/store/postgres_direct.py``); else ``connection`` itself."""
        if self.direct is None or self._direct_connection is None:
            return connection
        return self._direct_connection(connection, self.direct, self._prepared_kept)

    @asynccontextmanager
    async def reads(self) -> AsyncGenerator[StoreTx, None]:
        """Statements that only read (no lock, no write), which need no transaction of their own.

        Inside a transaction of the task, that transaction. Else on PostgreSQL no transaction at all: each statement
        alone, in autocommit, without a BEGIN and a COMMIT (two round trips fewer, issue 9). In READ COMMITTED, which
        the store runs in, a statement reads its own snapshot either way. On SQLite, a transaction (``atomic()``).
        Never write in it: on PostgreSQL each write would commit by itself.
        """
        async with self._statements_alone() as tx:
            yield tx

    def _statements_alone(self) -> AbstractAsyncContextManager[StoreTx]:
        """Each statement alone in autocommit on PostgreSQL (no BEGIN, no COMMIT); inside a transaction of the task,
        that transaction; on SQLite, a transaction (``atomic()``)."""
        if self._autocommit is None or _current_tx.get() is not None:
            return self.atomic()
        return _autocommitted(self, self._autocommit)

    # Convenience wrappers: one transaction per call, or none for a read (see reads()). ------------------------------

    async def create_conversation(
        self,
        *,
        agent_name: str,
        model: str | None = None,
        subject: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> ConversationRecord:
        """Create a conversation with a new id (see :meth:`StoreTx.create_conversation`).

        Its one statement, an ``INSERT``, needs no transaction of its own: on PostgreSQL it runs alone in autocommit,
        without a BEGIN and a COMMIT (two round trips fewer, issue 9); inside a transaction of the task, in it.
        """
        async with self._statements_alone() as tx:
            return await tx.create_conversation(agent_name=agent_name, model=model, subject=subject, metadata=metadata)

    async def load_conversation(self, conversation_id: str) -> ConversationRecord:
        """The conversation ``conversation_id``; raises :class:`RecordNotFound` when absent."""
        async with self.reads() as tx:
            return await tx.load_conversation(conversation_id)

    async def load_turn(self, turn_id: str) -> TurnRecord:
        """The turn ``turn_id``; raises :class:`RecordNotFound` when absent."""
        async with self.reads() as tx:
            return await tx.load_turn(turn_id)

    async def list_messages(
        self, conversation_id: str, *, through_sequence: int | None = None, turn_id: str | None = None
    ) -> list[MessageRecord]:
        """Messages of a conversation in sequence order (see :meth:`StoreTx.list_messages`)."""
        async with self.reads() as tx:
            return await tx.list_messages(conversation_id, through_sequence=through_sequence, turn_id=turn_id)

    async def list_turns(
        self,
        *,
        root_turn_id: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        statuses: Iterable[str] | None = None,
        has_parent: bool | None = None,
    ) -> list[TurnRecord]:
        """Turns matching every given filter, ordered by ``created_at, id`` (see :meth:`StoreTx.list_turns`)."""
        async with self.reads() as tx:
            return await tx.list_turns(
                root_turn_id=root_turn_id,
                conversation_id=conversation_id,
                agent_name=agent_name,
                statuses=statuses,
                has_parent=has_parent,
            )

    async def list_submitted_turns(self, *, limit: int | None = None) -> list[TurnRecord]:
        """Every submitted turn (``submitted_at`` set), ordered by ``created_at, id`` (see
        :meth:`StoreTx.list_submitted_turns`)."""
        async with self.reads() as tx:
            return await tx.list_submitted_turns(limit=limit)

    async def list_tool_executions(
        self, *, turn_id: str | None = None, root_turn_id: str | None = None
    ) -> list[ToolExecutionRecord]:
        """Tool executions of a turn (or of a whole root tree), ordered by ``created_at, id``."""
        async with self.reads() as tx:
            return await tx.list_tool_executions(turn_id=turn_id, root_turn_id=root_turn_id)

    async def append_message(self, conversation_id: str, **attrs: Any) -> MessageRecord:
        """Append a message with the next sequence (see :meth:`StoreTx.append_message`)."""
        async with self.atomic(conversation_id=conversation_id) as tx:
            return await tx.append_message(conversation_id, **attrs)


class StoreTx(ToolExecutionsTx, ConversationsTx, DeliveriesTx, WaitsTx, StagedInputsTx, MediaTx):
    """The store's operations inside one open transaction (get one from :meth:`Store.atomic`): every record's, from
    the modules of :mod:`turnkit.store.tx`."""
