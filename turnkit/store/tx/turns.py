"""A store transaction's turn records (behaviour §2.4, §2.8) and the root-tree counters (behaviour §6.3): the sums
over a tree's records, kept on its root row."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import turnkit.store.statements as sql
from turnkit._engine.ids import new_id
from turnkit.kernel.errors import RecordNotFound
from turnkit.kernel.records import TreeUsage, TurnRecord, TurnStatus
from turnkit.kernel.turn_state import TurnOptions
from turnkit.store.rows import (
    NewRow,
    canonical_json,
    check_turn_status,
    iterations_of,
    money,
    rowcount,
    tool_counts_of,
    turn_record,
    turn_values,
    utcnow,
)
from turnkit.store.schema import TurnRow
from turnkit.store.tx.base import ZERO, TxBase


@dataclass(frozen=True)
class OutsideLane:
    """The active turns of a conversation that its lane does not run (:meth:`StoreTx.turns_outside_lane`)."""

    #: A sub-agent's turn (started by its parent) is active: the lane holds until its end sends ``wake``.
    sub_agent: bool
    #: The turn ``ask`` started without the lane (a fresh conversation's first turn), while it is active.
    direct: TurnRecord | None


class TurnsTx(TxBase):
    """A store transaction's turn records and its root tree's counters."""

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

    async def find_child_turn(self, parent_tool_execution_id: str) -> TurnRecord | None:
        """The child turn a tool execution created (sub-agent delegation or launch), or None."""
        row = await self._read_one(sql.CHILD_TURN, uid=parent_tool_execution_id)
        return None if row is None else turn_record(row)

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

    async def _add_to_tree(self, root_turn_id: str | None, iterations: int = 0, cost: Decimal = ZERO) -> None:
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
            return None, 0, ZERO
        known = self._turn_counts.get(turn_id)
        if known is None:
            query = sql.TURN_COUNTS
            if self.store.dialect == "postgresql":
                query = sql.TURN_COUNTS_LOCKED
                self._locked.add(("turn", turn_id))
            row = await self._read_one(query, uid=turn_id)
            if row is None:
                return None, 0, ZERO
            known = (row.root_turn_uid, iterations_of(row.options), money(row.cost))
        root, old_iterations, old_cost = known
        iterations = iterations_of(values["options"]) - old_iterations if "options" in values else 0
        cost = money(values["cost"]) - old_cost if "cost" in values else ZERO
        if root == turn_id:
            values.update(sql.tree_increments(iterations, cost))
            return None, 0, ZERO
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
