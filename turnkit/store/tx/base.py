"""What every store transaction has (:class:`TxBase`): its connection, the row locks of PostgreSQL (with a
:class:`Look`'s reads in the same statement), the idempotent create and the insert, the prebuilt reads, and the rows it
keeps while no other writer can change them.

The records' operations build on it, one module a record: ``conversations``, ``turns`` (with the root-tree counters),
``messages``, ``tool_executions``, ``deliveries``, ``waits``, ``staged_inputs`` and ``media``.
:class:`turnkit.store.store.StoreTx` is all of them together.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, cast, overload

from sqlalchemy import Select, text
from sqlalchemy.engine import CursorResult, Row
from sqlalchemy.ext.asyncio import AsyncConnection

import turnkit.store.statements as sql
from turnkit.store.rows import NewRow, insert_columns, insert_skipping_conflicts, iterations_of, money, row_values
from turnkit.store.sqlite_inline import InlineConnection

if TYPE_CHECKING:
    # asyncpg (the `postgres` extra) is imported by a store on PostgreSQL only: SQLite needs no PostgreSQL driver.
    from turnkit.store.postgres_direct import DirectConnection
    from turnkit.store.store import Store

#: A store transaction's connection: inline on a SQLite file, direct on PostgreSQL, else a Core connection of the async
#: engine.
StoreConnection: TypeAlias = "InlineConnection | DirectConnection | AsyncConnection"


#: A cost of nothing, the counters' default.
ZERO: Final = Decimal(0)


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


#: What a look found for "none" (``TxBase._take_look``).
ABSENT: Final = object()
#: Whether a look's answer is kept: always, only when the lock vouches for it (``StoreTx._lock_and_look``), or never.
Keep = Literal["always", "vouched", "never"]
#: Per part of a look: whether what it found is kept, and whether its "none" is. A response found stands (messages are
#: never updated or deleted); an execution found is read again (its status may have changed while the statement
#: waited); the latest response found stands (the one that proposed a running call committed before the call was
#: scheduled, so every snapshot since sees it; a newer one only replaces it as the latest, and read_arguments then
#: lists the turn's messages), and its "none" is not kept (that path reads them too); the call ids found may miss one
#: whose execution was committed while the statement waited, so they are kept as "none" is.
LOOK_KEEPS: Final[dict[str, tuple[Keep, Keep]]] = {
    "response": ("always", "vouched"),
    "execution": ("never", "vouched"),
    "latest": ("always", "never"),
    "calls": ("vouched", "vouched"),
}


class TxBase:
    """The state and the shared steps of one store transaction (:class:`turnkit.store.store.StoreTx`)."""

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
        # What the turn lock's Look read, by the keys of the read it answers (once): a row, or ABSENT for "none".
        self._looked: dict[tuple[str, ...], Any] = {}
        self.committed_callbacks: list[Callable[[], Awaitable[None]]] = []

    def after_commit(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Run ``callback`` once this transaction has committed, in registration order; never after a rollback.

        Inside a joined ``atomic()`` it waits for the outermost transaction. An exception from ``callback`` reaches
        the caller of ``atomic()`` with the writes already committed.
        """
        self.committed_callbacks.append(callback)

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
        # Which of the parts' answers may be kept (LOOK_KEEPS). The parts come from the snapshot the statement took
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
            keep = LOOK_KEEPS[part][0 if found else 1]
            if keep == "always" or (keep == "vouched" and vouched):
                self._looked[look.key(part)] = (
                    SimpleNamespace(**dict(zip(keys, values, strict=True))) if found else ABSENT
                )
        return True

    def _take_look(self, *key: str) -> Any:
        """What the lock's :class:`Look` read for ``key`` (a row, or ``ABSENT``), once; None when it read nothing
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

    async def lock_wait_graph(self) -> None:
        """Serialise wait-graph changes store-wide (behaviour §2.9 ``atomic_graph``) until the transaction ends.

        PostgreSQL takes a transaction-scoped advisory lock; SQLite's single writer lock already serialises.
        """
        if self.store.dialect == "postgresql":
            await self.connection.execute(text("SELECT pg_advisory_xact_lock(1414876747)"))
