"""The TurnKit store (behaviour §2.9) on SQLAlchemy's async engine: SQLite (embedded default) or PostgreSQL.

Two rules hold for every write here:

* **Idempotent creates.** Records are created by natural key (a caller-chosen id, ``(turn_id, tool_call_id)``, a
  delivery ``key``); creating again returns the existing row, so a retried or zombie activity cannot duplicate.
* **Compare-and-set status changes.** ``claim_turn`` / ``claim_tool_execution`` are ``UPDATE … WHERE status IN
  (from)`` and report whether they won, so a late writer can never overwrite a newer state.

``Store.atomic()`` opens one transaction (a :class:`StoreTx`) and can take row locks: the conversation row
(message sequences, the lane) and the root turn row (root-tree budgets). On PostgreSQL those are ``SELECT … FOR
UPDATE``; on SQLite every write transaction is ``BEGIN IMMEDIATE``, which serialises writers database-wide.

The statements are in ``turnkit/store/statements.py``, a row's values in and out (records of rows, new rows, their
checks) in ``turnkit/store/rows.py``, and the engine a store opens in ``turnkit/store/engine.py``.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, Unpack, cast, overload

from sqlalchemy import (
    Select,
    delete,
    select,
    text,
)
from sqlalchemy.engine import CursorResult, Engine, Row
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

import turnkit.store.statements as sql
from turnkit._engine.ids import new_id
from turnkit.kernel.errors import RecordNotFound, ToolError
from turnkit.kernel.records import (
    OPEN_EXECUTION_STATUSES,
    ConversationRecord,
    DeliveryRecord,
    MediaRecord,
    MessageRecord,
    ToolExecutionRecord,
    ToolExecutionStatus,
    TreeUsage,
    TurnRecord,
    TurnStatus,
    WaitRecord,
    counts_against_budget,
)
from turnkit.kernel.turn_state import TurnOptions
from turnkit.store.direct import DirectStatements
from turnkit.store.engine import sqlite_file, store_engine
from turnkit.store.kept_connections import KeptConnections
from turnkit.store.rows import (
    TOOL_EXECUTION_UPDATE_FIELDS,
    NewMessage,
    NewRow,
    canonical_json,
    check_tool_status,
    check_turn_status,
    conversation_record,
    delivery_record,
    insert_columns,
    insert_skipping_conflicts,
    iterations_of,
    media_id_for,
    media_record,
    message_record,
    money,
    new_message_row,
    prefixed,
    row_values,
    rowcount,
    str_or_none,
    tool_counts_of,
    tool_execution_record,
    tool_result_row,
    turn_record,
    turn_values,
    utcnow,
    wait_record,
)
from turnkit.store.schema import (
    ConversationRow,
    DeliveryRow,
    MediaRow,
    StagedInputRow,
    ToolExecutionRow,
    TurnRow,
    WaitRow,
)
from turnkit.store.sqlite_inline import InlineConnection, InlineSQLite

__all__ = [
    "DEFAULT_DATABASE_URL",
    "KeptRows",
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

_ZERO: Final = Decimal(0)

if TYPE_CHECKING:
    # asyncpg (the `postgres` extra) is imported by a store on PostgreSQL only: SQLite needs no PostgreSQL driver.
    from turnkit.store.postgres_direct import DirectConnection

#: A store transaction's connection: inline on a SQLite file, direct on PostgreSQL, else a Core connection of the async
#: engine.
StoreConnection: TypeAlias = "InlineConnection | DirectConnection | AsyncConnection"


# The transaction of the current task, so that nested ``atomic()`` calls join it (behaviour §2.9: re-entrant).
_current_tx: contextvars.ContextVar[StoreTx | None] = contextvars.ContextVar("turnkit_store_tx", default=None)


@dataclass(frozen=True)
class OutsideLane:
    """The active turns of a conversation that its lane does not run (:meth:`StoreTx.turns_outside_lane`)."""

    #: A sub-agent's turn (started by its parent) is active: the lane holds until its end sends ``wake``.
    sub_agent: bool
    #: The turn ``ask`` started without the lane (a fresh conversation's first turn), while it is active.
    direct: TurnRecord | None


def in_transaction() -> bool:
    """Whether the current task is inside a store transaction (application callbacks must never run there)."""
    return _current_tx.get() is not None


@asynccontextmanager
async def _autocommitted(store: Store, engine: AsyncEngine) -> AsyncGenerator[StoreTx, None]:
    """A StoreTx whose statements each commit alone (``engine`` in autocommit)."""
    async with engine.connect() as connection:
        yield StoreTx(store, store.direct_connection(connection))


@dataclass(frozen=True)
class Look:
    """What a transaction reads next of one turn (``turn_id``), read with its turn lock in the same statement
    (``Store.atomic(look=…)``): one round trip per transaction fewer on PostgreSQL. SQLite, which locks no rows and
    has no round trips, reads it apart as before.

    Build it with :meth:`response` (a model call's reserve and persist) or :meth:`execution` (a tool call's
    reserve). The transaction's next :meth:`StoreTx.find_response`, :meth:`StoreTx.find_tool_execution` or
    :meth:`StoreTx.latest_response` of the same keys takes the answer instead of a statement, once; an answer the
    lock cannot vouch for is not kept, and that read goes to the database as before (``StoreTx.lock``).
    """

    turn_id: str
    request_id: str | None = None
    tool_call_id: str | None = None
    call_ids: tuple[str, ...] = ()

    @classmethod
    def response(cls, turn_id: str, request_id: str, call_ids: Iterable[str] = ()) -> Look:
        """The turn's response to model request ``request_id`` (``find_response``); with ``call_ids``, also which of
        them have an execution in the turn (``existing_call_ids``: a response's proposed calls)."""
        return cls(turn_id, request_id=request_id, call_ids=tuple(sorted({str(i) for i in call_ids})))

    @classmethod
    def execution(cls, turn_id: str, tool_call_id: str) -> Look:
        """The execution of the turn's call ``tool_call_id`` (``find_tool_execution``) and the turn's latest
        response (``latest_response``: where the call's stored arguments are)."""
        return cls(turn_id, tool_call_id=tool_call_id)

    @property
    def parts(self) -> tuple[sql.LookPart, ...]:
        """The statement's parts (:func:`turnkit.store.statements.turn_look`)."""
        if self.tool_call_id is not None:
            return ("execution", "latest")
        return ("response", "calls") if self.call_ids else ("response",)

    def key(self, part: sql.LookPart) -> tuple[str, ...]:
        """Where the transaction keeps what ``part`` read: the key of the read it answers (``StoreTx._take_look``)."""
        if part == "latest":
            return ("latest", self.turn_id)
        if part == "calls":
            return ("calls", self.turn_id, *self.call_ids)
        return (part, self.turn_id, str(self.request_id if part == "response" else self.tool_call_id))

    def params(self) -> dict[str, Any]:
        """The parts' bound parameters."""
        params: dict[str, Any] = {"turn_uid": self.turn_id}
        if self.request_id is not None:
            params["request_uid"] = self.request_id
        if self.tool_call_id is not None:
            params["tool_call_id"] = self.tool_call_id
        if self.call_ids:
            params["call_ids"] = list(self.call_ids)
        return params


_ABSENT: Final = object()
#: Whether a look's answer is kept: always, only when the lock vouches for it (``StoreTx._lock_and_look``), or never.
_Keep = Literal["always", "vouched", "never"]
#: Per part of a look: whether what it found is kept, and whether its "none" is. A response found stands (messages are
#: never updated or deleted); an execution found is read again (its status may have changed while the statement
#: waited); the latest response found stands (the one that proposed a running call committed before the call was
#: scheduled, so every snapshot since sees it; a newer one only replaces it as the latest, and read_arguments then
#: lists the turn's messages), and its "none" is not kept (that path reads them too); the call ids found may miss one
#: whose execution was committed while the statement waited, so they are kept as "none" is.
_LOOK_KEEPS: Final[dict[str, tuple[_Keep, _Keep]]] = {
    "response": ("always", "vouched"),
    "execution": ("never", "vouched"),
    "latest": ("always", "never"),
    "calls": ("vouched", "vouched"),
}


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


class StoreTx:
    """The store's operations inside one open transaction (get one from :meth:`Store.atomic`)."""

    def __init__(self, store: Store, connection: StoreConnection) -> None:
        self.store = store
        #: The transaction's connection, for a statement the store has no method for (``turnkit check``'s scans).
        self.connection = connection
        self._locked: set[tuple[str, str]] = set()
        # A turn's counted values (root, iterations, cost) as this transaction last read or wrote them, while no other
        # writer can change them: a turn write counts its change from here instead of reading the row again.
        self._turn_counts: dict[str, tuple[str, int, Decimal]] = {}
        # Every turn's root as read (a turn's root never changes), and a root's by-name tool counts as this transaction
        # last read or wrote them under the same rule as _turn_counts: a tool call's count skips its read.
        self._roots: dict[str, str] = {}
        self._tool_counts: dict[str, dict[str, int]] = {}
        # Whole turn rows as this transaction last read them, under the rule of _turn_counts: a read of the same turn
        # (load_turn, find_turn, tree_usage of a root) takes the row from here instead of a round trip. Every write of
        # a turn row forgets it (_forget_turn).
        self._turn_rows: dict[str, Row[Any]] = {}
        # Conversation rows as read (never inside a savepoint): a conversation row is never updated or deleted, so the
        # row read with the conversation's lock serves the transaction's later reads of it (load_conversation). The
        # ones this transaction created are not committed yet: the store does not keep them (Store.conversation_rows).
        self._conversation_rows: dict[str, Row[Any]] = {}
        self._created_conversations: set[str] = set()
        # What the turn lock's Look read, by the keys of the read it answers (once): a row, or _ABSENT for "none".
        self._looked: dict[tuple[str, ...], Any] = {}
        self.committed_callbacks: list[Callable[[], Awaitable[None]]] = []

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` once this transaction has committed, in registration order; never after a rollback.

        Inside a joined ``atomic()`` it waits for the outermost transaction. An exception from ``callback`` reaches
        the caller of ``atomic()`` with the writes already committed.
        """
        self.committed_callbacks.append(callback)

    # Locks -------------------------------------------------------------------------------------------------------

    async def lock(
        self, *, conversation_id: str | None = None, turn_id: str | None = None, look: Look | None = None
    ) -> None:
        """Lock a conversation row and/or a turn row until the transaction ends (a no-op on SQLite); with ``look``
        (and ``turn_id``), read what it names in the same statement (see :class:`Look`)."""
        if self.store.dialect != "postgresql":
            # BEGIN IMMEDIATE already holds SQLite's single writer lock. A look is not read with it: a SQLite statement
            # is no round trip, and one joined statement cost as much CPU as the two reads (bench/README.md, Look).
            return
        if (
            look is not None
            and turn_id is not None
            and ("turn", turn_id) not in self._locked
            and await self._lock_and_look(conversation_id, turn_id, look)
        ):
            return
        if (
            conversation_id
            and turn_id
            and ("conversation", conversation_id) not in self._locked
            and ("turn", turn_id) not in self._locked
        ):
            # Both in one round trip, the conversation's first (the order of every lock of both); the turn's row comes
            # back. No row: one of them is missing, and the locks below tell which, as they always did.
            params = {"conversation_uid": conversation_id, "uid": turn_id}
            row = (await self.connection.execute(sql.LOCK_CONVERSATION_AND_TURN, params)).first()
            if row is not None:
                self._locked.update({("conversation", conversation_id), ("turn", turn_id)})
                self._remember_counts(row)
                return
        if conversation_id and ("conversation", conversation_id) not in self._locked:
            # The lock reads the whole row, as the turn's does below.
            row = (await self.connection.execute(sql.LOCK_CONVERSATION, {"uid": conversation_id})).first()
            self._locked.add(("conversation", conversation_id))
            if row is not None:
                self._remember_conversation(row)
        if turn_id and ("turn", turn_id) not in self._locked:
            # The lock reads the whole row, which the transaction's next read of the turn then takes for free (the
            # lock and the read in one round trip: issue 9).
            row = (await self.connection.execute(sql.LOCK_TURN, {"uid": turn_id})).first()
            self._locked.add(("turn", turn_id))
            if row is not None:
                self._remember_counts(row)

    async def _lock_and_look(self, conversation_id: str | None, turn_id: str, look: Look) -> bool:
        """The locks of :meth:`lock` (PostgreSQL) with ``look``'s reads in the same statement; False when nothing was
        locked (a row is missing: :meth:`lock` then takes its locks one by one, which tell which)."""
        if conversation_id is not None and ("conversation", conversation_id) in self._locked:
            conversation_id = None  # held already: only the turn's lock is taken
        statement = sql.turn_look(look.parts, conversation=conversation_id is not None)
        params = {"uid": turn_id, **look.params()}
        if conversation_id is not None:
            params["conversation_uid"] = conversation_id
        row = (await self.connection.execute(statement.statement, params)).first()
        if row is None:
            return False
        self._locked.add(("turn", turn_id))
        if conversation_id is not None:
            self._locked.add(("conversation", conversation_id))
        self._remember_counts(row)
        # Which of the parts' answers may be kept (_LOOK_KEEPS). The parts come from the snapshot the statement took
        # before it waited for the lock (turn_look), so "none" stands only when the lock is on the looked turn itself
        # and its row is the version the snapshot saw (``fresh``). Every transaction that could have added what a
        # part looks for writes that turn's row: a response's comes with its charge, a counted execution's with the
        # root's tool counts, an uncounted (cancelled) one with the turn's status or state (a cancel, a steering, the
        # turn's end, the calls skipped after a terminal tool). One that committed while the statement waited thus
        # leaves ``fresh`` false, and the part is read again.
        vouched = bool(row.fresh) and look.turn_id == turn_id
        for part in look.parts:
            keys, values = statement.keys[part], row[statement.columns[part]]
            found = values[0] is not None  # a part's first column is NULL exactly when it found nothing
            keep = _LOOK_KEEPS[part][0 if found else 1]
            if keep == "always" or (keep == "vouched" and vouched):
                self._looked[look.key(part)] = (
                    SimpleNamespace(**dict(zip(keys, values, strict=True))) if found else _ABSENT
                )
        return True

    def _take_look(self, *key: str) -> Any:
        """What the lock's :class:`Look` read for ``key`` (a row, or ``_ABSENT``), once; None when it read nothing
        that can answer."""
        return self._looked.pop(key, None) if self._looked else None

    async def _get_or_create(
        self,
        find: Callable[[], Awaitable[Row[Any] | None]],
        build: Callable[[], NewRow],
        *,
        look_first: bool = True,
        found_absent: bool = False,
    ) -> tuple[Row[Any] | NewRow, bool]:
        """The row with a natural key, else a new one: ``(row, created)``. Every idempotent create goes through here.

        ``find`` reads the row by its natural key (unique in the schema); ``build`` makes the new row. On PostgreSQL
        the insert skips a conflict (``ON CONFLICT DO NOTHING``) so that the loser of a concurrent create race gets the
        winner's row instead of an ``IntegrityError`` and an aborted transaction; on SQLite no race is possible
        (below). ``look_first=False`` skips the first read and the conflict handling when the key was just generated
        (nothing can exist yet).
        ``found_absent=True`` skips the first read only: the caller looked for the row in this transaction already.
        """
        if not look_first:
            # A key just generated cannot exist, so no create race can happen: a plain insert, whose IntegrityError
            # (should one happen) raises.
            return await self._insert(build()), True
        if not found_absent:
            existing = await find()
            if existing is not None:
                return existing, False
        row = build()
        if self.store.dialect == "sqlite":
            # Every SQLite transaction is BEGIN IMMEDIATE: no other writer can commit between the read that found no
            # row and this insert, so there is no race to survive.
            return await self._insert(row), True
        # PostgreSQL: INSERT … ON CONFLICT DO NOTHING. The loser of a concurrent create race (its insert waits on the
        # unique index for the winner's commit) inserts nothing and reads the winner's row, in a transaction that is
        # not aborted: one statement where a savepoint, the insert and its release made three (issue 9).
        if await self._insert(row, skip_conflict=True):
            return row, True
        found = await find()  # READ COMMITTED: this statement's snapshot sees the winner's commit
        if found is not None:
            return found, False
        # The conflict was on another unique key than the natural one: the plain insert raises its IntegrityError.
        return await self._insert(row), True

    @overload
    async def _insert(self, row: NewRow) -> NewRow: ...
    @overload
    async def _insert(self, row: NewRow, *, skip_conflict: Literal[True]) -> bool: ...
    async def _insert(self, row: NewRow, *, skip_conflict: bool = False) -> NewRow | bool:
        """INSERT a new row, as one Core statement, and return it with its columns set (defaults and the generated
        primary key included).

        ``skip_conflict=True`` (PostgreSQL): ``ON CONFLICT DO NOTHING``; returns whether the row was inserted.

        Not through the ORM's unit of work: a flush (identity map, mapper events, post-fetch) cost about three times
        the CPU of the statement itself, for objects nothing changes afterwards (CPU per turn, issue 9). The object
        is a plain carrier of the row's values; no session tracks it.
        """
        values = row_values(row)
        if skip_conflict:
            inserted = (await self.connection.execute(insert_skipping_conflicts(row.mapped), values)).first()
            if inserted is not None and row.id is None:
                row.id = inserted[0]
            return inserted is not None
        insert, _, returning = insert_columns(row.mapped)
        if self.store.dialect == "postgresql" and row.id is None:
            # The generated key with an explicit RETURNING, which the direct path runs; SQLAlchemy's implicit one
            # (what ``inserted_primary_key`` reads on PostgreSQL) only its own execution context can (direct.py).
            row.id = (await self.connection.execute(returning, values)).scalar()
            return row
        result = cast(CursorResult[Any], await self.connection.execute(insert, values))
        primary_key = result.inserted_primary_key
        if primary_key is not None and row.id is None:
            row.id = primary_key[0]
        return row

    # Conversations -----------------------------------------------------------------------------------------------

    async def create_conversation(
        self,
        *,
        agent_name: str,
        model: str | None = None,
        subject: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        id: str | None = None,
    ) -> ConversationRecord:
        """Create a conversation; with an ``id`` that already exists, return the existing record."""
        if not agent_name:
            raise ValueError("agent_name is required")
        uid = id or new_id("conversation")

        def build() -> NewRow:
            now = utcnow()
            return NewRow(
                ConversationRow,
                uid=uid,
                agent_name=agent_name,
                model=model,
                subject_type=None if subject is None else str_or_none(subject.get("type")),
                subject_id=None if subject is None else str_or_none(subject.get("id")),
                metadata_=canonical_json(metadata or {}),
                created_at=now,
                updated_at=now,
            )

        row, created = await self._get_or_create(
            lambda: self._read_one(sql.CONVERSATION_BY_UID, uid=uid), build, look_first=id is not None
        )
        if created:
            self._created_conversations.add(uid)  # not committed yet: the store does not keep it (load_conversation)
        return conversation_record(row)

    async def load_conversation(self, conversation_id: str) -> ConversationRecord:
        """The conversation; raises :class:`RecordNotFound` when absent."""
        row = self._conversation_rows.get(conversation_id) or self.store.conversation_rows.get(conversation_id)
        if row is None:
            row = await self._read_one(sql.CONVERSATION_BY_UID, uid=conversation_id)
            if row is None:
                raise RecordNotFound(f"conversation not found: {conversation_id}")
            self._remember_conversation(row)
        return conversation_record(row)

    def _remember_conversation(self, row: Row[Any]) -> None:
        """Keep a conversation row for the next reads of it: conversation rows never change once written. The store
        keeps it for every transaction once it is committed: unless this transaction created it, it was committed
        before this transaction could read it. This transaction keeps it too, unless it was read inside a savepoint,
        whose rollback may remove a conversation created inside it."""
        if row.uid not in self._created_conversations:
            self.store.conversation_rows.keep(row)
        if not self.connection.in_nested_transaction():
            self._conversation_rows[row.uid] = row

    async def _read_one(self, statement: Select[*tuple[Any, ...]], **params: Any) -> Row[Any] | None:
        """The first row of a prebuilt read (:mod:`turnkit.store.statements`), or None."""
        return (await self.connection.execute(statement, params)).first()

    async def _read_all(self, statement: Select[*tuple[Any, ...]], **params: Any) -> Sequence[Row[Any]]:
        """Every row of a read (prebuilt, or built of :mod:`turnkit.store.statements`' tables)."""
        return (await self.connection.execute(statement, params)).all()

    # Messages ----------------------------------------------------------------------------------------------------

    async def append_message(self, conversation_id: str, **message: Unpack[NewMessage]) -> MessageRecord:
        """Append a message with sequence ``max + 1``, atomically with the insert (gap-free under concurrency).

        ``text`` is shorthand for ``[{"type": "text", "text": text}]``. With an ``id`` that already exists the
        stored message is returned and nothing is written. ``request_id`` marks an assistant response as the answer
        to that model request (found again with :meth:`find_response`).
        """
        row = new_message_row(conversation_id, message)
        appended, _ = await self._append(row, unless=None if message.get("id") is None else "uid")
        return appended

    async def append_message_and_update_turn(
        self, conversation_id: str, *, message: NewMessage, turn_id: str, turn_updates: dict[str, Any]
    ) -> tuple[MessageRecord, TurnRecord]:
        """:meth:`append_message` (``message``: its keyword arguments) then :meth:`update_turn` of ``turn_id``
        (``turn_updates``): the message and the turn as written.

        On PostgreSQL, with the conversation's lock held and the turn's counted values known (its row read with its
        lock), both writes are one statement (``statements.turn_update_appending``): a model call's response and its
        charge, one round trip fewer. Elsewhere, two.
        """
        row = new_message_row(conversation_id, message)
        unless: Literal["uid"] | None = None if message.get("id") is None else "uid"
        if (
            self.store.dialect != "postgresql"
            or ("conversation", conversation_id) not in self._locked
            or turn_id not in self._turn_counts
            or self.connection.in_nested_transaction()
        ):
            appended, _ = await self._append(row, unless=unless)
            return appended, await self.update_turn(turn_id, **turn_updates)
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote
        values = turn_values(turn_updates)
        other_root = await self._count_turn_change(turn_id, values)  # known: no statement
        params = {**values, "b_uid": turn_id, **prefixed("m_", row_values(row))}
        statement = sql.turn_update_appending(params, new=unless is None)
        self._forget_turn(turn_id)
        found = (await self.connection.execute(statement, params)).one_or_none()
        if found is None:
            raise RecordNotFound(f"turn not found: {turn_id}")
        self._remember_counts(found)  # the UPDATE holds the row's lock until the transaction ends
        if found.message_id is None:
            # Nothing appended: a message with the given id exists (it is returned), or the conversation is gone
            # (RecordNotFound, and the transaction's writes roll back).
            appended, _ = await self._append(row, unless=unless)
        else:
            row.id, row.sequence = found.message_id, found.message_sequence
            appended = message_record(row)
        await self._add_to_tree(*other_root)
        return appended, turn_record(found)

    async def append_tool_result(
        self,
        conversation_id: str,
        *,
        turn_id: str,
        tool_execution_id: str,
        content: Sequence[dict[str, Any]],
        metadata: dict[str, Any],
    ) -> tuple[MessageRecord, bool]:
        """Append the tool-result message of ``tool_execution_id`` (role ``tool``, kind ``tool_result``) unless the
        execution has a message already: ``(message, True)``, or ``(that message, False)`` with nothing written."""
        row = tool_result_row(conversation_id, turn_id, tool_execution_id, content, metadata)
        return await self._append(row, unless="tool_execution")

    async def _append(
        self, row: NewRow, *, unless: Literal["uid", "tool_execution"] | None
    ) -> tuple[MessageRecord, bool]:
        """Insert ``row`` with its conversation's next sequence, unless a message with its ``uid`` (or a message of its
        tool execution) exists: ``(message, created)``. Raises :class:`RecordNotFound` when the conversation is
        absent."""
        conversation_id = row.conversation_uid
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote
        # test_store fix: lock first, then look for the existing message, so that concurrent appends of one explicit
        # id (in transactions that did not lock the conversation up front) see each other instead of IntegrityError.
        await self.lock(conversation_id=conversation_id)
        statement, existing = (
            (sql.APPEND_MESSAGE, None)
            if unless is None
            else (sql.APPEND_NEW_MESSAGE, (sql.MESSAGE_BY_UID, row.uid))
            if unless == "uid"
            else (sql.APPEND_FIRST_TOOL_RESULT, (sql.TOOL_RESULT_MESSAGE, row.tool_execution_uid))
        )
        if self.store.engine.dialect.insert_returning:
            # The conversation's latest sequence, its existence, the existing message's absence and the insert in one
            # statement (issue 9); only when no row comes back, a read tells an existing message from a missing
            # conversation.
            inserted = (await self.connection.execute(statement, row_values(row))).first()
            if inserted is None:
                found = None if existing is None else await self._read_one(existing[0], uid=existing[1])
                if found is None:
                    raise RecordNotFound(f"conversation not found: {conversation_id}")
                return message_record(found), False
            row.id, row.sequence = inserted
            return message_record(row), True
        # A SQLite without INSERT … RETURNING (before 3.35): the same in two or three statements.
        if existing is not None:
            found = await self._read_one(existing[0], uid=existing[1])
            if found is not None:
                return message_record(found), False
        latest = await self._read_one(sql.CONVERSATION_AND_LATEST_SEQUENCE, uid=conversation_id)
        if latest is None:
            raise RecordNotFound(f"conversation not found: {conversation_id}")
        row.sequence = int(latest.latest or 0) + 1
        await self._insert(row)
        return message_record(row), True

    async def latest_message_sequence(self, conversation_id: str) -> int:
        """The highest sequence in the conversation, 0 when it has no messages."""
        value = await self.connection.scalar(sql.LATEST_SEQUENCE, {"uid": conversation_id})
        return int(value or 0)

    async def load_message(self, message_id: str) -> MessageRecord:
        """The message; raises :class:`RecordNotFound` when absent."""
        found = await self.find_message(message_id)
        if found is None:
            raise RecordNotFound(f"message not found: {message_id}")
        return found

    async def find_message(self, message_id: str) -> MessageRecord | None:
        """The message, or None when absent (what an idempotent write looks up before writing it under its id)."""
        row = await self._read_one(sql.MESSAGE_BY_UID, uid=message_id)
        return None if row is None else message_record(row)

    async def list_messages(
        self,
        conversation_id: str,
        *,
        through_sequence: int | None = None,
        turn_id: str | None = None,
        after_sequence: int | None = None,
    ) -> list[MessageRecord]:
        """Messages in ``sequence`` order.

        With ``through_sequence``: only rows with ``sequence <= N`` or ``turn_id == turn_id`` (a turn's frozen
        context plus its own messages, ``messages_for_turn`` in behaviour §1.3). With ``after_sequence``: rows after it.
        """
        query = sql.messages(
            through=through_sequence is not None, turn=turn_id is not None, after=after_sequence is not None
        )
        params = {"uid": conversation_id, "through": through_sequence, "turn_uid": turn_id, "after": after_sequence}
        rows = await self._read_all(query, **{key: value for key, value in params.items() if value is not None})
        return [message_record(row) for row in rows]

    async def list_turn_messages(self, turn_id: str) -> list[MessageRecord]:
        """The messages a turn wrote (its ``turn_id``), in sequence order."""
        return [message_record(row) for row in await self._read_all(sql.TURN_MESSAGES, uid=turn_id)]

    async def find_response(self, turn_id: str, request_id: str, *, kind: str | None = None) -> MessageRecord | None:
        """The assistant response a turn persisted for model request ``request_id`` (an indexed lookup), or None.

        A request may have two messages: the automatic compaction summary made before it (``kind=
        "context_summary"``) and the response itself (any other kind, the default).
        """
        if kind != "context_summary":
            looked = self._take_look("response", turn_id, request_id)
            if looked is not None:
                return None if looked is _ABSENT else message_record(looked)
        query = sql.SUMMARY_FOR if kind == "context_summary" else sql.RESPONSE_TO
        row = await self._read_one(query, turn_uid=turn_id, request_uid=request_id)
        return None if row is None else message_record(row)

    async def latest_response(self, turn_id: str) -> MessageRecord | None:
        """The turn's latest assistant response to a model request (an indexed lookup), or None."""
        row = self._take_look("latest", turn_id) or await self._read_one(sql.LATEST_RESPONSE, turn_uid=turn_id)
        return None if row is None else message_record(row)

    async def tool_result_message(self, tool_execution_id: str) -> MessageRecord | None:
        """The tool-result message of an execution, if one was appended."""
        row = await self._read_one(sql.TOOL_RESULT_MESSAGE, uid=tool_execution_id)
        return None if row is None else message_record(row)

    # Turns -------------------------------------------------------------------------------------------------------

    async def create_turn(
        self,
        *,
        conversation_id: str,
        agent_name: str,
        id: str | None = None,
        root_turn_id: str | None = None,
        parent_turn_id: str | None = None,
        parent_tool_execution_id: str | None = None,
        context_message_sequence: int = 0,
        status: str = "pending",
        model: str | None = None,
        options: TurnOptions | dict[str, Any] | None = None,
        submitted_at: datetime | None = None,
        found_absent: bool = False,
        direct: bool = False,
    ) -> TurnRecord:
        """Create a turn; with an ``id`` that already exists, return the existing record unchanged.

        ``found_absent=True``: the caller found no turn ``id`` in this transaction, so it is not looked for again.
        ``direct=True``: ``ask`` starts it without the conversation's lane (:meth:`turns_outside_lane`).
        """
        check_turn_status(status)
        turn_id = id or new_id("turn")

        def build() -> NewRow:
            now = utcnow()
            return NewRow(
                TurnRow,
                uid=turn_id,
                conversation_uid=conversation_id,
                agent_name=agent_name,
                parent_turn_uid=parent_turn_id,
                parent_tool_execution_uid=parent_tool_execution_id,
                root_turn_uid=root_turn_id or turn_id,
                context_message_sequence=context_message_sequence,
                status=status,
                model=model,
                options=canonical_json(options.stored() if isinstance(options, TurnOptions) else options or {}),
                usage={},
                submitted_at=submitted_at,
                direct=direct,
                created_at=now,
                updated_at=now,
            )

        row, created = await self._get_or_create(
            lambda: self._read_one(sql.TURN_BY_UID, uid=turn_id),
            build,
            look_first=id is not None,
            found_absent=found_absent,
        )
        if created:
            await self._add_to_tree(row.root_turn_uid, iterations_of(row.options))
        return turn_record(row)

    async def load_turn(self, turn_id: str) -> TurnRecord:
        """The turn; raises :class:`RecordNotFound` when absent."""
        turn = await self.find_turn(turn_id)
        if turn is None:
            raise RecordNotFound(f"turn not found: {turn_id}")
        return turn

    async def find_turn_or_any(
        self, turn_id: str, conversation_id: str, *, unfinished: bool = False
    ) -> tuple[TurnRecord | None, bool]:
        """``(the turn, True)`` if it exists; else ``(None, whether the conversation has any turn)``, or with
        ``unfinished`` ``(None, whether it has a turn that is not terminal)``: a turn that may skip the lane asks
        both in one statement (:mod:`turnkit._engine.direct_turn`)."""
        statement = sql.TURN_OR_UNFINISHED_OF_CONVERSATION if unfinished else sql.TURN_OR_ANY_OF_CONVERSATION
        row = await self._read_one(statement, uid=turn_id, conversation_uid=conversation_id)
        if row is None:
            return None, False
        if row.uid != turn_id:
            return None, True
        self._remember_counts(row)
        return turn_record(row), True

    async def find_turn(self, turn_id: str) -> TurnRecord | None:
        """The turn, or None when absent."""
        row = self._turn_rows.get(turn_id)
        if row is None:
            row = await self._read_one(sql.TURN_BY_UID, uid=turn_id)
            if row is None:
                return None
            self._remember_counts(row)
        return turn_record(row)

    def _remember_counts(self, row: Row[Any]) -> None:
        """Keep a whole turn row (``TURN_BY_UID``, ``LOCK_TURN``, ``TURN_RETURNING``) for the transaction's next reads
        of it, and its counted values for :meth:`_count_turn_change`, when they cannot change under us: on SQLite the
        transaction holds the writer lock from its start; on PostgreSQL only a row this transaction has locked (read
        after the lock, or written). Never inside a savepoint, which may roll back what it read."""
        self._roots[row.uid] = row.root_turn_uid
        if self.connection.in_nested_transaction():
            self._forget_turn(row.uid)
        elif self._unchanging(row.uid):
            self._turn_counts[row.uid] = (row.root_turn_uid, iterations_of(row.options), money(row.cost))
            self._turn_rows[row.uid] = row

    def _forget_turn(self, turn_id: str) -> None:
        """Before a write of the turn's row (or inside a savepoint, which may roll back what it reads): forget what
        this transaction remembered of it, so that the next read goes to the database."""
        self._turn_counts.pop(turn_id, None)
        self._turn_rows.pop(turn_id, None)

    def _unchanging(self, turn_id: str) -> bool:
        """Whether no other writer can change the turn row until this transaction ends (see _remember_counts)."""
        return self.store.dialect != "postgresql" or ("turn", turn_id) in self._locked

    async def find_child_turn(self, parent_tool_execution_id: str) -> TurnRecord | None:
        """The child turn a tool execution created (sub-agent delegation or launch), or None."""
        row = await self._read_one(sql.CHILD_TURN, uid=parent_tool_execution_id)
        return None if row is None else turn_record(row)

    async def lock_wait_graph(self) -> None:
        """Serialise wait-graph changes store-wide (behaviour §2.9 ``atomic_graph``) until the transaction ends.

        PostgreSQL takes a transaction-scoped advisory lock; SQLite's single writer lock already serialises.
        """
        if self.store.dialect == "postgresql":
            await self.connection.execute(text("SELECT pg_advisory_xact_lock(1414876747)"))

    async def update_turn(self, turn_id: str, **attrs: Any) -> TurnRecord:
        """Update whitelisted fields (behaviour §2.8) and touch ``updated_at``."""
        values = turn_values(attrs)
        other_root = await self._count_turn_change(turn_id, values)
        updated = await self._update_turn_row(turn_id, values)
        if updated is None:
            raise RecordNotFound(f"turn not found: {turn_id}")
        await self._add_to_tree(*other_root)
        return updated if isinstance(updated, TurnRecord) else await self.load_turn(turn_id)

    async def claim_turn(
        self,
        turn_id: str,
        *,
        from_: TurnStatus | Iterable[TurnStatus] = "pending",
        to: TurnStatus = "running",
        **attrs: Any,
    ) -> TurnRecord | None:
        """Compare-and-set the status: ``from_`` (one status or several) → ``to``. None when the CAS lost."""
        expected = [from_] if isinstance(from_, str) else list(from_)
        for status in [*expected, to]:
            check_turn_status(status)
        values = turn_values({**attrs, "status": to})
        other_root = await self._count_turn_change(turn_id, values)
        updated = await self._update_turn_row(turn_id, values, expected=expected)
        if updated is None:
            return None
        await self._add_to_tree(*other_root)
        return updated if isinstance(updated, TurnRecord) else await self.load_turn(turn_id)

    async def _update_turn_row(
        self, turn_id: str, values: dict[str, Any], *, expected: Sequence[str] | None = None
    ) -> TurnRecord | bool | None:
        """UPDATE the turn's row with ``values`` (columns, and :func:`statements.tree_increments`), only
        while its status is one of ``expected`` when given. Returns the row as written (``RETURNING``, one statement
        instead of an UPDATE and a SELECT: CPU per turn, issue 9), else True when a row matched (a backend without
        ``UPDATE … RETURNING``), else None."""
        returning = self.store.engine.dialect.update_returning
        params = {**values, "b_uid": turn_id}
        if expected is not None:
            params["b_expected"] = expected
        statement = sql.turn_update(params, cas=expected is not None, returning=returning)
        self._forget_turn(turn_id)
        if not returning:
            self._turn_counts.clear()
            return True if rowcount(await self.connection.execute(statement, params)) else None
        row = (await self.connection.execute(statement, params)).one_or_none()
        if row is None:
            return None
        if self.store.dialect == "postgresql" and not self.connection.in_nested_transaction():
            self._locked.add(("turn", row.uid))  # the UPDATE holds the row's lock until the transaction ends
        self._remember_counts(row)
        return turn_record(row)

    # Root-tree counters (behaviour §6.3): the sums over a tree's records, kept on its root row ----------------------

    async def tree_usage(self, root_turn_id: str) -> TreeUsage:
        """What the tree of ``root_turn_id`` has used: one row read, however large the tree (issue 9).

        Equal to :meth:`TreeUsage.from_records` over the tree's turns and tool executions: every write of a counted
        value (a turn's ``options.state.iterations`` or ``cost``, an execution's creation or status) updates the
        root's totals in its own transaction. Hold the root's lock to check and then reserve.
        """
        row = self._turn_rows.get(root_turn_id)  # the root's own turn, read in this transaction: no round trip
        if row is None:
            row = await self._read_one(sql.TREE_USAGE, uid=root_turn_id)
        if row is None:
            raise RecordNotFound(f"turn not found: {root_turn_id}")
        by_name = row.tree_tool_executions_by_name
        self._remember_tool_counts(root_turn_id, by_name)
        return TreeUsage(
            iterations=int(row.tree_iterations or 0),
            tool_executions=int(row.tree_tool_executions or 0),
            tool_executions_by_name={str(k): int(v) for k, v in (by_name or {}).items() if v},
            cost=float(row.tree_cost or 0),
        )

    async def _add_to_tree(self, root_turn_id: str | None, iterations: int = 0, cost: Decimal = _ZERO) -> None:
        """Add to the root's running totals of iterations and cost (in SQL; a no-op for zero)."""
        values = sql.tree_increments(iterations, cost)
        if root_turn_id is not None and values:
            self._turn_rows.pop(root_turn_id, None)  # its tree totals change (its counts in _turn_counts do not)
            params = {**values, "b_uid": root_turn_id}
            await self.connection.execute(sql.turn_update(params, cas=False, returning=False), params)

    async def _count_turn_change(self, turn_id: str, values: dict[str, Any]) -> tuple[str | None, int, Decimal]:
        """Before a turn write that may change its iterations or cost: the root-total increments it makes.

        A root's own increments are added to ``values`` (the same UPDATE, so they apply exactly when it does);
        another root's are returned for :meth:`_add_to_tree` once the write won. One row read (locked on PostgreSQL,
        so that the change counted is the change made), and only for writes of ``options`` or ``cost``.
        """
        if "options" not in values and "cost" not in values:
            return None, 0, _ZERO
        known = self._turn_counts.get(turn_id)
        if known is None:
            query = sql.TURN_COUNTS
            if self.store.dialect == "postgresql":
                query = sql.TURN_COUNTS_LOCKED
                self._locked.add(("turn", turn_id))
            row = await self._read_one(query, uid=turn_id)
            if row is None:
                return None, 0, _ZERO
            known = (row.root_turn_uid, iterations_of(row.options), money(row.cost))
        root, old_iterations, old_cost = known
        iterations = iterations_of(values["options"]) - old_iterations if "options" in values else 0
        cost = money(values["cost"]) - old_cost if "cost" in values else _ZERO
        if root == turn_id:
            values.update(sql.tree_increments(iterations, cost))
            return None, 0, _ZERO
        return root, iterations, cost

    async def _count_execution(self, turn_id: str, tool_name: str, delta: int) -> None:
        """Add ``delta`` (+1 or -1) counted executions of ``tool_name`` by ``turn_id`` to its root's totals.

        The by-name counts are a JSON map: read-modify-write, the root row found through the turn and locked in the
        same statement (callers usually hold that lock already).
        """
        if not delta:
            return
        known = self._known_tool_counts(turn_id)
        if known is None:
            # Not read under the lock in this transaction: read (and lock) the root's counts.
            postgresql = self.store.dialect == "postgresql"
            row = await self._read_one(sql.ROOT_TOOL_COUNTS_LOCKED if postgresql else sql.ROOT_TOOL_COUNTS, uid=turn_id)
            if row is None:
                return  # a turn whose root row is gone counts nowhere (as in the sums over the records)
            if self.store.dialect == "postgresql" and not self.connection.in_nested_transaction():
                self._locked.add(("turn", row.uid))
            known = row.uid, tool_counts_of(row.tree_tool_executions_by_name)
        root, by_name = known
        counts = {**by_name, tool_name: by_name.get(tool_name, 0) + delta}
        self._turn_rows.pop(root, None)  # its tree totals change
        await self.connection.execute(sql.COUNT_TOOL_EXECUTIONS, {"b_uid": root, "add_tools": delta, "by_name": counts})
        self._remember_tool_counts(root, counts)

    def _known_tool_counts(self, turn_id: str) -> tuple[str, dict[str, int]] | None:
        """``turn_id``'s root and the root's by-name tool counts as this transaction knows them while no other writer
        can change them (:meth:`_remember_tool_counts`, or the root's whole row kept by :meth:`_remember_counts`), or
        None: not known (or inside a savepoint), to be read."""
        root = self._roots.get(turn_id)
        if root is None or self.connection.in_nested_transaction():
            return None
        known = self._tool_counts.get(root)
        if known is None and (row := self._turn_rows.get(root)) is not None:
            known = tool_counts_of(row.tree_tool_executions_by_name)
        return None if known is None else (root, known)

    def _remember_tool_counts(self, root_turn_id: str, by_name: dict[str, Any] | None) -> None:
        """Keep a root's by-name tool counts for :meth:`_count_execution`, under the rule of :meth:`_remember_counts`
        (a savepoint may roll back what it wrote: inside one, forget them instead)."""
        if self.connection.in_nested_transaction():
            self._tool_counts.pop(root_turn_id, None)
        elif self._unchanging(root_turn_id):
            self._tool_counts[root_turn_id] = tool_counts_of(by_name)

    async def list_turns(
        self,
        *,
        root_turn_id: str | None = None,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        statuses: Iterable[str] | None = None,
        has_parent: bool | None = None,
    ) -> list[TurnRecord]:
        """Turns matching every given filter (AND), ordered by ``created_at, id``.

        ``statuses`` keeps turns in any of those statuses; ``has_parent`` keeps sub-agent turns (True) or root
        turns (False).
        """
        turns = sql.TURNS.c
        query = sql.whole_rows(TurnRow)
        if statuses is not None:
            query = query.where(turns.status.in_(list(statuses)))
        if has_parent is not None:
            query = query.where(turns.parent_turn_uid.is_not(None) if has_parent else turns.parent_turn_uid.is_(None))
        if root_turn_id is not None:
            query = query.where(turns.root_turn_uid == root_turn_id)
        if conversation_id is not None:
            query = query.where(turns.conversation_uid == conversation_id)
        if agent_name is not None:
            query = query.where(turns.agent_name == agent_name)
        return [turn_record(row) for row in await self._read_all(query.order_by(turns.created_at, turns.id))]

    async def turns_outside_lane(self, conversation_id: str) -> OutsideLane:
        """The active turns of the conversation that its lane does not run: whether a sub-agent's is (started by its
        parent), and the turn ``ask`` started directly, if it is still active (a fresh conversation's first turn).

        The lane holds new input and new turns while a sub-agent's turn is active, until that turn's end sends it
        ``wake`` (:func:`turnkit._engine.deliveries.wake_lane`), and runs the direct turn before anything of its own
        (docs/design.md), so a conversation has one active turn at a time. One prebuilt statement (every submit asks).
        """
        rows = (await self.connection.execute(sql.TURNS_OUTSIDE_LANE, {"uid": conversation_id})).all()
        direct = next((turn_record(row) for row in rows if row.direct), None)
        return OutsideLane(sub_agent=any(row.parent_turn_uid is not None for row in rows), direct=direct)

    async def unqueued_turns(
        self, conversation_id: str, known_turn_id: str | None, *, limit: int = 64
    ) -> list[TurnRecord]:
        """The conversation's submitted root turns that have not started and that its lane may not have queued: those
        submitted at or after ``known_turn_id`` (the newest turn the lane queued; every one when None or unknown),
        oldest first, at most ``limit``. ``ask``'s direct turn is not among them (:meth:`turns_outside_lane`).

        The lane queues in submission order, so a turn whose submission it lost (the workflow task that ran the
        submit was lost with its worker and server) is newer than every turn it knows (docs/design.md, "Lost
        submissions"); the known turn itself comes back too, and the lane skips what it knows.
        """
        rows = await self._read_all(sql.UNQUEUED_TURNS, uid=conversation_id, known_uid=known_turn_id, limit=limit)
        return [turn_record(row) for row in rows]

    async def unstarted_turns(
        self, *, before: datetime, after: tuple[datetime, str] | None = None, limit: int = 100
    ) -> list[TurnRecord]:
        """Submitted root turns of any conversation that have not started, submitted by ``before``, oldest first,
        after the key ``(submitted_at, id)`` ``after`` (a page of :func:`turnkit._ops.lost_submits.heal_lost_submits`).
        """
        after_at, after_uid = after if after is not None else (datetime(1970, 1, 1, tzinfo=UTC), "")
        rows = await self._read_all(
            sql.UNSTARTED_TURNS, before=before, after_at=after_at, after_uid=after_uid, limit=limit
        )
        return [turn_record(row) for row in rows]

    async def list_submitted_turns(self, *, limit: int | None = None) -> list[TurnRecord]:
        """Every turn with ``submitted_at`` set, ordered by ``created_at, id``, at most ``limit`` (behaviour §2.9): an
        inventory for applications; prepared turns (``build_turn``) are not in it until they are submitted."""
        turns = sql.TURNS.c
        query = sql.whole_rows(TurnRow).where(turns.submitted_at.is_not(None)).order_by(turns.created_at, turns.id)
        if limit is not None:
            query = query.limit(limit)
        return [turn_record(row) for row in await self._read_all(query)]

    # Tool executions ---------------------------------------------------------------------------------------------

    async def create_tool_execution(
        self,
        *,
        turn_id: str,
        tool_call_id: str,
        tool_name: str,
        arguments: dict[str, Any] | None = None,
        status: str = "pending",
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        started_at: datetime | None = None,
        completed_at: datetime | None = None,
        found_absent: bool = False,
    ) -> tuple[ToolExecutionRecord, bool]:
        """Get or create the execution of ``(turn_id, tool_call_id)``. Returns ``(record, created)``.

        ``found_absent=True``: the caller found no execution for the call in this transaction (under the root turn's
        lock), so it is not looked for again (a concurrent creator is still handled, see ``_get_or_create``).
        """
        check_tool_status(status)
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote

        def build() -> NewRow:
            now = utcnow()
            return NewRow(
                ToolExecutionRow,
                uid=new_id("tool_execution"),
                turn_uid=turn_id,
                tool_call_id=tool_call_id,
                tool_name=tool_name,
                status=status,
                arguments=canonical_json(arguments or {}),
                result=None if result is None else canonical_json(result),
                error=None if error is None else canonical_json(error),
                started_at=started_at,
                completed_at=completed_at,
                created_at=now,
                updated_at=now,
            )

        if found_absent and counts_against_budget(status, error):
            counted = await self._create_counted_execution(build(), turn_id, tool_name)
            if counted is not None:
                return counted, True
        # Natural key: the unique (turn_uid, tool_call_id).
        row, created = await self._get_or_create(
            lambda: self._read_one(sql.EXECUTION_BY_CALL, turn_uid=turn_id, tool_call_id=tool_call_id),
            build,
            found_absent=found_absent,
        )
        if created and counts_against_budget(row.status, row.error):
            await self._count_execution(turn_id, tool_name, 1)
        return tool_execution_record(row), created

    async def _create_counted_execution(self, row: NewRow, turn_id: str, tool_name: str) -> ToolExecutionRecord | None:
        """PostgreSQL, with the root's tool counts read under its lock in this transaction: insert ``row`` and count it
        in one statement (``CREATE_COUNTED_EXECUTION``), one round trip per tool call fewer. None when that does not
        apply, or when a concurrent creator's row was there (nothing written or counted): the caller then takes the
        general path, which finds that row."""
        if self.store.dialect != "postgresql":
            return None
        known = self._known_tool_counts(turn_id)
        if known is None:
            return None
        root, by_name = known
        counts = {**by_name, tool_name: by_name.get(tool_name, 0) + 1}
        params = {**prefixed("e_", row_values(row)), "b_uid": root, "add_tools": 1, "by_name": counts}
        self._turn_rows.pop(root, None)  # its tree totals change
        inserted = (await self.connection.execute(sql.CREATE_COUNTED_EXECUTION, params)).scalar()
        if inserted is None:
            return None
        row.id = inserted
        self._remember_tool_counts(root, counts)
        return tool_execution_record(row)

    async def existing_call_ids(self, turn_id: str, tool_call_ids: Iterable[str]) -> set[str]:
        """Which of ``tool_call_ids`` already have an execution in the turn (an indexed lookup of those ids only)."""
        wanted = sorted({str(i) for i in tool_call_ids})
        if not wanted:
            return set()
        looked = self._take_look("calls", turn_id, *wanted)
        if looked is not None:
            return set() if looked is _ABSENT else {str(i) for i in looked.ids}
        rows = await self.connection.scalars(sql.EXISTING_CALL_IDS, {"turn_uid": turn_id, "ids": wanted})
        return set(rows)

    async def find_tool_execution(self, turn_id: str, tool_call_id: str) -> ToolExecutionRecord | None:
        """The execution of ``(turn_id, tool_call_id)``, or None."""
        looked = self._take_look("execution", turn_id, tool_call_id)
        if looked is _ABSENT:
            return None
        row = looked or await self._read_one(sql.EXECUTION_BY_CALL, turn_uid=turn_id, tool_call_id=tool_call_id)
        return None if row is None else tool_execution_record(row)

    async def load_tool_execution(self, execution_id: str) -> ToolExecutionRecord:
        """The execution; raises :class:`RecordNotFound` when absent."""
        row = await self._read_one(sql.EXECUTION_BY_UID, uid=execution_id)
        if row is None:
            raise RecordNotFound(f"tool execution not found: {execution_id}")
        return tool_execution_record(row)

    async def claim_tool_execution(
        self,
        execution_id: str,
        *,
        from_: ToolExecutionStatus | Iterable[ToolExecutionStatus] = "running",
        to: ToolExecutionStatus = "completed",
        **attrs: Any,
    ) -> ToolExecutionRecord | None:
        """Compare-and-set an execution's status (first commit wins). None when the CAS lost."""
        expected = [from_] if isinstance(from_, str) else list(from_)
        for status in [*expected, to]:
            check_tool_status(status)
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote
        unknown = set(attrs) - TOOL_EXECUTION_UPDATE_FIELDS
        if unknown:
            raise ValueError(f"unknown tool execution update attributes: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {"status": to, "updated_at": utcnow()}
        for key, value in attrs.items():
            values[key] = canonical_json(value) if key in ("result", "error") and value is not None else value
        # Whether the execution counted against the budget before: pending and running ones always do (they carry
        # no error); from any other status, read it (its row locked, so the count cannot drift).
        counted_before = True
        if not set(expected) <= {"pending", "running"}:
            await self.lock_tool_execution(execution_id)
            old = await self._read_one(sql.EXECUTION_COUNTED, uid=execution_id)
            counted_before = old is None or counts_against_budget(old.status, old.error)
        params = {**values, "b_uid": execution_id, "b_expected": expected}
        if self.store.engine.dialect.update_returning:  # the row as written: no second SELECT (issue 9)
            row = (await self.connection.execute(sql.CLAIM_EXECUTION_RETURNING, params)).one_or_none()
            if row is None:
                return None
            settled = tool_execution_record(row)
        else:
            if rowcount(await self.connection.execute(sql.CLAIM_EXECUTION, params)) == 0:
                return None
            settled = await self.load_tool_execution(execution_id)
        delta = int(settled.counts_against_budget) - int(counted_before)
        await self._count_execution(settled.turn_id, settled.tool_name, delta)
        return settled

    async def complete_tool_execution(
        self,
        execution: ToolExecutionRecord,
        *,
        conversation_id: str,
        result: dict[str, Any],
        completed_at: datetime,
        result_message: Callable[[ToolExecutionRecord], tuple[list[dict[str, Any]], dict[str, Any]]],
    ) -> tuple[ToolExecutionRecord, MessageRecord, bool] | None:
        """Compare-and-set an open (pending or running) execution to ``completed`` with ``result`` and, when that won,
        append its tool-result message to ``conversation_id`` (as :meth:`append_tool_result`): ``(the execution as
        written, the message, created)``, or None when the compare-and-set lost (nothing written). ``result_message``
        gives the message's content and metadata for the execution as written; ``created`` is False when the
        execution had its message already (that one is returned).

        The caller holds the root turn's lock and the conversation's (an append's lock). On PostgreSQL both writes
        are one statement (``COMPLETE_EXECUTION_WITH_RESULT``): one round trip per tool call fewer.
        """
        if self.store.dialect != "postgresql" or ("conversation", conversation_id) not in self._locked:
            settled = await self.claim_tool_execution(
                execution.id, from_=OPEN_EXECUTION_STATUSES, to="completed", result=result, completed_at=completed_at
            )
            if settled is None:
                return None
            content, metadata = result_message(settled)
            message, created = await self.append_tool_result(
                conversation_id,
                turn_id=execution.turn_id,
                tool_execution_id=execution.id,
                content=content,
                metadata=metadata,
            )
            return settled, message, created
        self._looked.clear()  # a look answers reads of what was there before this transaction wrote
        stored, now = canonical_json(result), utcnow()
        # The execution as the compare-and-set writes it (the JSON as stored): its message is built before the
        # statement that writes both, and is the one the execution as read back would give.
        written = execution.model_copy(
            update={"status": "completed", "result": stored, "completed_at": completed_at, "updated_at": now}
        )
        row = tool_result_row(conversation_id, execution.turn_id, execution.id, *result_message(written))
        params = {
            **prefixed("m_", row_values(row)),
            "b_uid": execution.id,
            "b_expected": list(OPEN_EXECUTION_STATUSES),
            "s_status": "completed",
            "s_result": stored,
            "s_completed_at": completed_at,
            "s_updated_at": now,
        }
        found = (await self.connection.execute(sql.COMPLETE_EXECUTION_WITH_RESULT, params)).first()
        if found is None:
            return None
        settled = tool_execution_record(found)
        # Open executions count against the budget; a completed one without an error still does (no change).
        await self._count_execution(settled.turn_id, settled.tool_name, int(settled.counts_against_budget) - 1)
        if found.message_id is None:
            # Nothing appended: the execution had its message already, or the conversation is gone; the append
            # returns the first, raises RecordNotFound for the second.
            message, created = await self._append(row, unless="tool_execution")
            return settled, message, created
        row.id, row.sequence = found.message_id, found.message_sequence
        return settled, message_record(row), True

    async def lock_tool_execution(self, execution_id: str) -> None:
        """Lock an execution row until the transaction ends (a no-op on SQLite)."""
        if self.store.dialect == "postgresql":
            await self.connection.execute(sql.LOCK_EXECUTION, {"uid": execution_id})

    async def list_tool_executions(
        self, *, turn_id: str | None = None, root_turn_id: str | None = None
    ) -> list[ToolExecutionRecord]:
        """Executions of one turn, or of every turn in a root tree, ordered by ``created_at, id``."""
        executions = sql.TOOL_EXECUTIONS.c
        query = sql.whole_rows(ToolExecutionRow)
        if turn_id is not None:
            query = query.where(executions.turn_uid == turn_id)
        if root_turn_id is not None:
            tree = select(sql.TURNS.c.uid).where(sql.TURNS.c.root_turn_uid == root_turn_id)
            query = query.where(executions.turn_uid.in_(tree))
        rows = await self._read_all(query.order_by(executions.created_at, executions.id))
        return [tool_execution_record(row) for row in rows]

    # Deliveries --------------------------------------------------------------------------------------------------

    async def create_delivery(
        self,
        *,
        source_conversation_id: str,
        destination_conversation_id: str,
        key: str,
        payload: dict[str, Any],
        source_turn_id: str | None = None,
    ) -> tuple[DeliveryRecord, bool]:
        """Create a delivery, idempotent by its globally unique ``key``. Returns ``(record, created)``.

        The same key with the same route and payload returns the original; anything else raises ``ToolError``
        without revealing the other payload (behaviour §2.9).
        """
        if not key:
            raise ValueError("delivery key is required")
        payload = canonical_json(payload)

        def build() -> NewRow:
            now = utcnow()
            return NewRow(
                DeliveryRow,
                uid=new_id("delivery"),
                source_conversation_uid=source_conversation_id,
                destination_conversation_uid=destination_conversation_id,
                source_turn_uid=source_turn_id,
                key=key,
                payload=payload,
                created_at=now,
                updated_at=now,
            )

        existing, created = await self._get_or_create(lambda: self._read_one(sql.DELIVERY_BY_KEY, key=key), build)
        if created:
            return delivery_record(existing), True
        same = (
            existing.source_conversation_uid == source_conversation_id
            and existing.destination_conversation_uid == destination_conversation_id
            and existing.source_turn_uid == source_turn_id
            and existing.payload == payload
        )
        if not same:
            raise ToolError("delivery key is already used for a different message")
        return delivery_record(existing), False

    async def find_delivery(self, key: str) -> DeliveryRecord | None:
        """The delivery with this idempotency key, or None."""
        row = await self._read_one(sql.DELIVERY_BY_KEY, key=key)
        return None if row is None else delivery_record(row)

    async def load_delivery(self, delivery_id: str) -> DeliveryRecord:
        """The delivery; raises :class:`RecordNotFound` when absent."""
        row = await self._read_one(sql.DELIVERY_BY_UID, uid=delivery_id)
        if row is None:
            raise RecordNotFound(f"delivery not found: {delivery_id}")
        return delivery_record(row)

    async def mark_delivered(self, delivery_id: str, *, message_id: str) -> DeliveryRecord | None:
        """Compare-and-set ``delivered_at`` from NULL. None when it was already delivered."""
        now = utcnow()
        result = await self.connection.execute(
            sql.MARK_DELIVERED,
            {"b_uid": delivery_id, "message_uid": message_id, "delivered_at": now, "updated_at": now},
        )
        if rowcount(result) == 0:
            return None
        return await self.load_delivery(delivery_id)

    async def list_deliveries(
        self,
        *,
        source_conversation_id: str | None = None,
        destination_conversation_id: str | None = None,
        pending: bool = False,
        limit: int | None = None,
        since: datetime | None = None,
    ) -> list[DeliveryRecord]:
        """Deliveries matching the filters, ordered by ``created_at, id``; ``since``: created or changed since then."""
        deliveries = sql.DELIVERIES.c
        query = sql.whole_rows(DeliveryRow)
        if since is not None:
            query = query.where(deliveries.updated_at >= since)
        if source_conversation_id is not None:
            query = query.where(deliveries.source_conversation_uid == source_conversation_id)
        if destination_conversation_id is not None:
            query = query.where(deliveries.destination_conversation_uid == destination_conversation_id)
        if pending:
            query = query.where(deliveries.delivered_at.is_(None))
        query = query.order_by(deliveries.created_at, deliveries.id)
        if limit is not None:
            query = query.limit(limit)
        return [delivery_record(row) for row in await self._read_all(query)]

    # Waits -------------------------------------------------------------------------------------------------------

    async def create_wait(self, *, turn_id: str, target_turn_id: str) -> tuple[WaitRecord, bool]:
        """Create the edge ``turn_id → target_turn_id`` (idempotent). Returns ``(record, created)``."""

        async def find() -> Row[Any] | None:
            return await self._read_one(sql.WAIT_EDGE, turn_uid=turn_id, target_turn_uid=target_turn_id)

        def build() -> NewRow:
            now = utcnow()
            return NewRow(WaitRow, turn_uid=turn_id, target_turn_uid=target_turn_id, created_at=now, updated_at=now)

        row, created = await self._get_or_create(find, build)
        return wait_record(row), created

    async def list_waits(self, *, turn_id: str | None = None, target_turn_id: str | None = None) -> list[WaitRecord]:
        """Wait edges matching the filters, in creation order."""
        if (turn_id is None) != (target_turn_id is None):  # the hot cases: one filter, a prebuilt statement
            query = sql.WAITS_OF_TURN if turn_id is not None else sql.WAITS_ON_TARGET
            return [
                wait_record(row) for row in await self.connection.execute(query, {"uid": turn_id or target_turn_id})
            ]
        waits = sql.WAITS.c
        query = sql.whole_rows(WaitRow)
        if turn_id is not None:
            query = query.where(waits.turn_uid == turn_id)
        if target_turn_id is not None:
            query = query.where(waits.target_turn_uid == target_turn_id)
        return [wait_record(row) for row in await self._read_all(query.order_by(waits.id))]

    # Staged inputs -----------------------------------------------------------------------------------------------

    async def stage_input(self, staged_id: str, *, conversation_id: str, content: dict[str, Any]) -> bool:
        """Write what a submission carries (text, context, principal, metadata) under ``staged_id``, so that the
        lane's update carries only the id (issue 8 item 12). Idempotent by id: returns whether it was created.
        """

        def build() -> NewRow:
            return NewRow(
                StagedInputRow,
                uid=staged_id,
                conversation_uid=conversation_id,
                content=canonical_json(content),
                created_at=utcnow(),
            )

        _, created = await self._get_or_create(lambda: self._read_one(sql.STAGED_BY_UID, uid=staged_id), build)
        return created

    async def load_staged_input(self, staged_id: str) -> dict[str, Any]:
        """The content staged under ``staged_id``; raises :class:`RecordNotFound` when absent."""
        row = await self._read_one(sql.STAGED_CONTENT, uid=staged_id)
        if row is None:
            raise RecordNotFound(f"staged input not found: {staged_id}")
        return dict(row.content)

    async def delete_staged_input(self, staged_id: str) -> None:
        """Drop a staged input once its message exists (a no-op when it is gone already)."""
        await self.connection.execute(sql.DELETE_STAGED, {"uid": staged_id})

    async def drop_staged_inputs(self, *, older_than: datetime) -> list[str]:
        """Delete staged inputs written before ``older_than``: orphans of submissions whose update never reached
        their lane (``turnkit repair``). Returns their ids."""
        staged = sql.STAGED_INPUTS
        rows = await self.connection.scalars(
            delete(staged).where(staged.c.created_at < older_than).returning(staged.c.uid)
        )
        return sorted(rows)

    # Media -------------------------------------------------------------------------------------------------------

    async def put_media(self, data: bytes, *, mime_type: str, filename: str | None = None) -> MediaRecord:
        """Store media bytes and return their reference. Content-addressed, so idempotent: equal bytes have one row
        (the first writer's ``mime_type`` and ``filename`` stay)."""
        digest = hashlib.sha256(data).hexdigest()
        media_id = media_id_for(digest)

        def build() -> NewRow:
            return NewRow(
                MediaRow,
                uid=media_id,
                mime_type=mime_type,
                byte_size=len(data),
                sha256=digest,
                filename=filename,
                data=bytes(data),
                created_at=utcnow(),
            )

        row, _ = await self._get_or_create(lambda: self._read_one(sql.MEDIA_BY_UID, uid=media_id), build)
        return media_record(row)

    async def load_media(self, media_id: str) -> MediaRecord:
        """The reference of a stored media item; raises :class:`RecordNotFound` when absent."""
        # Only the columns of the reference: the bytes are not read.
        found = await self._read_one(sql.MEDIA_REFERENCE, uid=media_id)
        if found is None:
            raise RecordNotFound(f"media not found: {media_id}")
        return MediaRecord(
            id=found.uid,
            mime_type=found.mime_type,
            byte_size=found.byte_size,
            sha256=found.sha256,
            filename=found.filename,
        )

    async def load_media_data(self, media_id: str) -> bytes:
        """The bytes of a stored media item; raises :class:`RecordNotFound` when absent."""
        data = await self.connection.scalar(sql.MEDIA_DATA, {"uid": media_id})
        if data is None:
            raise RecordNotFound(f"media not found: {media_id}")
        return bytes(data)
