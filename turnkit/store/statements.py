"""The store's SQL, built once (issue 9, CPU per turn; docs/design.md "The store's SQL is built once").

Every statement here is Core on the tables, never on the ORM's mapped classes, and takes its values as bind
parameters. Three costs go away with that, on every call of the hot path:

* building and coercing the statement, and computing its cache key (SQLAlchemy memoises the key on the object);
* the ORM's loading (identity map, instance state) for reads: results are plain rows;
* the ORM's bulk UPDATE path and its session synchronisation for writes.

A row carries every column under its mapped attribute's name (``metadata_``, not ``metadata``): the record
converters in :mod:`turnkit.store.store` read rows and mapped objects alike. No mapped object is ever loaded into the
store's session, so a Core UPDATE can never leave a stale one behind.

An UPDATE's SET clause is the keys of the parameters it is executed with: SQLAlchemy compiles and caches one form
per set of keys. Its WHERE parameters are named ``b_*`` so that they never clash with a column's name.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, Literal, cast

from sqlalchemy import (
    ColumnElement,
    Delete,
    Insert,
    Select,
    Table,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    inspect,
    literal_column,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects import postgresql

from turnkit.kernel.records import ACTIVE_TURN_STATUSES, CANCELLABLE_TURN_STATUSES
from turnkit.store.schema import (
    ConversationRow,
    DeliveryRow,
    MediaRow,
    MessageRow,
    StagedInputRow,
    ToolExecutionRow,
    TurnRow,
    WaitRow,
)


def _table(model: type[Any]) -> Table:
    return cast(Table, model.__table__)  # pyright: ignore[reportAttributeAccessIssue]


CONVERSATIONS: Final = _table(ConversationRow)
MESSAGES: Final = _table(MessageRow)
TURNS: Final = _table(TurnRow)
TOOL_EXECUTIONS: Final = _table(ToolExecutionRow)
DELIVERIES: Final = _table(DeliveryRow)
WAITS: Final = _table(WaitRow)
STAGED_INPUTS: Final = _table(StagedInputRow)
MEDIA: Final = _table(MediaRow)


def columns(model: type[Any]) -> tuple[ColumnElement[Any], ...]:
    """Every column of ``model``'s table, each labelled with its mapped attribute's name (for SELECT and RETURNING)."""
    return tuple(attr.columns[0].label(attr.key) for attr in inspect(model).column_attrs)


def whole_rows(model: type[Any]) -> Select[*tuple[Any, ...]]:
    """``SELECT`` of every column of ``model``'s table (see :func:`columns`)."""
    return select(*columns(model))


# Reads by key -------------------------------------------------------------------------------------------------------

CONVERSATION_BY_UID: Final = whole_rows(ConversationRow).where(CONVERSATIONS.c.uid == bindparam("uid"))
TURN_BY_UID: Final = whole_rows(TurnRow).where(TURNS.c.uid == bindparam("uid"))
MESSAGE_BY_UID: Final = whole_rows(MessageRow).where(MESSAGES.c.uid == bindparam("uid"))
EXECUTION_BY_UID: Final = whole_rows(ToolExecutionRow).where(TOOL_EXECUTIONS.c.uid == bindparam("uid"))
EXECUTION_BY_CALL: Final = whole_rows(ToolExecutionRow).where(
    TOOL_EXECUTIONS.c.turn_uid == bindparam("turn_uid"), TOOL_EXECUTIONS.c.tool_call_id == bindparam("tool_call_id")
)
DELIVERY_BY_KEY: Final = whole_rows(DeliveryRow).where(DELIVERIES.c.key == bindparam("key"))
DELIVERY_BY_UID: Final = whole_rows(DeliveryRow).where(DELIVERIES.c.uid == bindparam("uid"))
WAIT_EDGE: Final = whole_rows(WaitRow).where(
    WAITS.c.turn_uid == bindparam("turn_uid"), WAITS.c.target_turn_uid == bindparam("target_turn_uid")
)
WAITS_OF_TURN: Final = whole_rows(WaitRow).where(WAITS.c.turn_uid == bindparam("uid")).order_by(WAITS.c.id)
WAITS_ON_TARGET: Final = whole_rows(WaitRow).where(WAITS.c.target_turn_uid == bindparam("uid")).order_by(WAITS.c.id)
STAGED_BY_UID: Final = whole_rows(StagedInputRow).where(STAGED_INPUTS.c.uid == bindparam("uid"))
STAGED_CONTENT: Final = select(STAGED_INPUTS.c.content).where(STAGED_INPUTS.c.uid == bindparam("uid"))
MEDIA_BY_UID: Final = whole_rows(MediaRow).where(MEDIA.c.uid == bindparam("uid"))
MEDIA_REFERENCE: Final = select(
    MEDIA.c.uid, MEDIA.c.mime_type, MEDIA.c.byte_size, MEDIA.c.sha256, MEDIA.c.filename
).where(MEDIA.c.uid == bindparam("uid"))
MEDIA_DATA: Final = select(MEDIA.c.data).where(MEDIA.c.uid == bindparam("uid"))

# Row locks (PostgreSQL only; SQLite's BEGIN IMMEDIATE holds the single writer lock) ----------------------------------

#: The conversation's whole row, locked: the lock and the read that often follows it, in one round trip. A
#: conversation row is never updated, so the transaction may reuse it (``StoreTx._conversation_rows``).
LOCK_CONVERSATION: Final = CONVERSATION_BY_UID.with_for_update(of=CONVERSATIONS)
#: The turn's whole row, locked: the lock and the read that usually follows it, in one round trip. In READ COMMITTED
#: a locked row is read as its newest version (PostgreSQL re-reads it once the lock is granted), so it may be reused
#: until the transaction writes it (``StoreTx._turn_rows``).
LOCK_TURN: Final = TURN_BY_UID.with_for_update(of=TURNS)
#: A conversation's row and a turn's (any turn: a sub-agent's call locks its root), locked in that order, as every
#: transaction that locks both does (``Store.atomic``), in one round trip; the turn's whole row comes back, and no row
#: when either is missing. A transaction that appends to a conversation under its turn's lock takes both at its start.
LOCK_CONVERSATION_AND_TURN: Final = (
    whole_rows(TurnRow)
    .select_from(CONVERSATIONS.join(TURNS, true()))
    .where(CONVERSATIONS.c.uid == bindparam("conversation_uid"), TURNS.c.uid == bindparam("uid"))
    .with_for_update(of=[CONVERSATIONS, TURNS])
)
LOCK_EXECUTION: Final = select(TOOL_EXECUTIONS.c.id).where(TOOL_EXECUTIONS.c.uid == bindparam("uid")).with_for_update()

# Messages -----------------------------------------------------------------------------------------------------------

#: The conversation's existence and its latest sequence, in one statement (an append reads both).
CONVERSATION_AND_LATEST_SEQUENCE: Final = select(
    CONVERSATIONS.c.id,
    select(func.max(MESSAGES.c.sequence))
    .where(MESSAGES.c.conversation_uid == bindparam("uid"))
    .scalar_subquery()
    .label("latest"),
).where(CONVERSATIONS.c.uid == bindparam("uid"))
#: The columns an append binds: every one but the generated ``id`` and the ``sequence`` that APPEND_MESSAGE computes.
APPENDED_COLUMNS: Final = tuple(column for column in MESSAGES.c if column.key not in ("id", "sequence"))


def _append(*unless: ColumnElement[bool], prefix: str = "") -> Insert:
    """Append a message with its conversation's next sequence, only when the conversation exists and every ``unless``
    holds (no row returned otherwise): the latest sequence's read, the checks and the insert in one statement (issue
    9). Binds each of APPENDED_COLUMNS by ``prefix`` + its key. On PostgreSQL, run it after the conversation's lock:
    in READ COMMITTED the statement's snapshot, taken after the lock was granted, then sees every append committed
    before it.
    """
    return (
        insert(MESSAGES)
        .from_select(
            [*APPENDED_COLUMNS, MESSAGES.c.sequence],
            select(
                *(bindparam(prefix + column.key, type_=column.type) for column in APPENDED_COLUMNS),
                select(func.coalesce(func.max(MESSAGES.c.sequence), 0) + 1)
                .where(MESSAGES.c.conversation_uid == bindparam(prefix + "conversation_uid"))
                .scalar_subquery(),
            ).where(CONVERSATIONS.c.uid == bindparam(prefix + "conversation_uid"), *unless),
        )
        .returning(MESSAGES.c.id, MESSAGES.c.sequence)
    )


_EARLIER: Final = MESSAGES.alias("earlier")
#: Append a message (see _append).
APPEND_MESSAGE: Final[Insert] = _append()
#: The same, unless a message with the bound ``uid`` exists (an append with an explicit id is idempotent).
APPEND_NEW_MESSAGE: Final[Insert] = _append(~exists().where(_EARLIER.c.uid == bindparam("uid")))
#: The same, unless the bound ``tool_execution_uid`` has a message already (an execution's result is appended once).
APPEND_FIRST_TOOL_RESULT: Final[Insert] = _append(
    ~exists().where(_EARLIER.c.tool_execution_uid == bindparam("tool_execution_uid"))
)

LATEST_SEQUENCE: Final = select(func.max(MESSAGES.c.sequence)).where(MESSAGES.c.conversation_uid == bindparam("uid"))
TURN_MESSAGES: Final = (
    whole_rows(MessageRow).where(MESSAGES.c.turn_uid == bindparam("uid")).order_by(MESSAGES.c.sequence)
)
TOOL_RESULT_MESSAGE: Final = whole_rows(MessageRow).where(MESSAGES.c.tool_execution_uid == bindparam("uid")).limit(1)


@functools.cache
def messages(*, through: bool, turn: bool, after: bool) -> Select[*tuple[Any, ...]]:
    """A conversation's messages (bound ``uid``) in sequence order: with ``through``, those with ``sequence <=``
    bound ``through`` or (with ``turn``) of bound ``turn_uid``; else with ``turn``, of that turn; with ``after``,
    those after bound ``after``. One statement per combination, built on first use."""
    query = whole_rows(MessageRow).where(MESSAGES.c.conversation_uid == bindparam("uid"))
    sequence, turn_uid = MESSAGES.c.sequence, MESSAGES.c.turn_uid
    if through:
        bound = sequence <= bindparam("through")
        query = query.where(bound | (turn_uid == bindparam("turn_uid")) if turn else bound)
    elif turn:
        query = query.where(turn_uid == bindparam("turn_uid"))
    if after:
        query = query.where(sequence > bindparam("after"))
    return query.order_by(sequence)


def _newest_response(*, summary: bool, request: bool) -> Select[*tuple[Any, ...]]:
    """The turn's newest response message: the summary (``summary``) or the response itself, of one request
    (``request``: bound ``request_uid``) or of any."""
    kind, request_uid = MESSAGES.c.kind, MESSAGES.c.request_uid
    query = whole_rows(MessageRow).where(
        MESSAGES.c.turn_uid == bindparam("turn_uid"),
        request_uid == bindparam("request_uid") if request else request_uid.is_not(None),
        kind == "context_summary" if summary else kind != "context_summary",
    )
    return query.order_by(MESSAGES.c.sequence.desc()).limit(1)


RESPONSE_TO: Final = _newest_response(summary=False, request=True)
SUMMARY_FOR: Final = _newest_response(summary=True, request=True)
LATEST_RESPONSE: Final = _newest_response(summary=False, request=False)


# A turn's row with what a transaction reads next, in one statement ------------------------------------------------

#: What a look reads beside the turn's row, by the name its columns are prefixed with: the response to one request
#: (bound ``turn_uid``, ``request_uid``), the execution of one call (bound ``turn_uid``, ``tool_call_id``), the
#: turn's latest response (bound ``turn_uid``, where a tool call's stored arguments are), and which of some call ids
#: have an execution in the turn (bound ``turn_uid``, ``call_ids``: an array of them, or NULL for none). A part's
#: first column is NULL exactly when it found nothing.
LookPart = Literal["response", "execution", "latest", "calls"]
_LOOK_READS: Final[dict[str, Select[*tuple[Any, ...]]]] = {
    "response": RESPONSE_TO,
    "execution": EXECUTION_BY_CALL.limit(1),
    "latest": LATEST_RESPONSE,
    # TEXT[], not VARCHAR[] (the column's type): asyncpg has no built-in codec for VARCHAR[], and learns one on each
    # new connection with its type introspection query, ~6-9 ms of the server's CPU (issue 37, bench/pg_server_cost.py).
    "calls": select(func.array_agg(TOOL_EXECUTIONS.c.tool_call_id.cast(Text)).label("ids")).where(
        TOOL_EXECUTIONS.c.turn_uid == bindparam("turn_uid"),
        TOOL_EXECUTIONS.c.tool_call_id == any_(bindparam("call_ids", type_=postgresql.ARRAY(Text))),
    ),
}
_SEEN_TURN: Final = TURNS.alias("seen_turn")


@dataclass(frozen=True)
class TurnLook:
    """A statement that reads a turn's whole row (bound ``uid``) and, beside it, each of ``parts`` (no row when the
    turn is missing; a part's columns are NULL when it has none), built by :func:`turn_look`.

    ``columns[part]`` is the slice of the row that holds the part's columns, ``keys[part]`` their names (the mapped
    attributes', as :func:`whole_rows` labels them); the turn's columns come first, under their own names.
    """

    statement: Select[*tuple[Any, ...]]
    columns: Mapping[str, slice]
    keys: Mapping[str, tuple[str, ...]]


@functools.cache
def turn_look(parts: tuple[LookPart, ...], *, conversation: bool) -> TurnLook:
    """:class:`TurnLook` of ``parts`` (PostgreSQL): the turn's row locked, as ``LOCK_TURN`` locks it (with
    ``conversation``, the conversation's row first, as ``LOCK_CONVERSATION_AND_TURN``), and a last column ``fresh``:
    whether the turn's row as locked is the version the statement's snapshot saw.

    Why ``fresh``: in READ COMMITTED a statement that waits for a row lock returns the locked row's newest version,
    but reads every other row (the parts) from the snapshot it took before it waited. A writer that committed
    meanwhile is invisible to the parts: the part that says "none" may be stale. When the writer changed the locked
    row, ``fresh`` is false and the caller reads the part again (``StoreTx._lock_and_look`` says which writers change
    it).
    """
    selected: list[ColumnElement[Any]] = list(columns(TurnRow))
    spans: dict[str, slice] = {}
    keys: dict[str, tuple[str, ...]] = {}
    joined: Any = CONVERSATIONS.join(TURNS, true()) if conversation else TURNS
    for part in parts:
        subquery = _LOOK_READS[part].subquery(f"look_{part}")
        spans[part] = slice(len(selected), len(selected) + len(subquery.c))
        keys[part] = tuple(column.key for column in subquery.c)
        selected.extend(column.label(f"{part}__{column.key}") for column in subquery.c)
        joined = joined.outerjoin(subquery, true())
    seen = select(literal_column("seen_turn.xmin")).select_from(_SEEN_TURN)
    seen = seen.where(_SEEN_TURN.c.uid == bindparam("uid"))
    selected.append((literal_column(f"{TURNS.name}.xmin") == seen.scalar_subquery()).label("fresh"))
    where = [TURNS.c.uid == bindparam("uid")]
    if conversation:
        where.append(CONVERSATIONS.c.uid == bindparam("conversation_uid"))
    statement = (
        select(*selected)
        .select_from(joined)
        .where(*where)
        .with_for_update(of=[CONVERSATIONS, TURNS] if conversation else TURNS)
    )
    return TurnLook(statement, spans, keys)


# Turns --------------------------------------------------------------------------------------------------------------

CHILD_TURN: Final = whole_rows(TurnRow).where(TURNS.c.parent_tool_execution_uid == bindparam("uid")).limit(1)
#: The active turns of a conversation that its lane does not run: a sub-agent's (started by its parent) and a
#: turn ``ask`` started directly (a fresh conversation's first). At most one of each can be active at a time.
TURNS_OUTSIDE_LANE: Final = (
    whole_rows(TurnRow)
    .where(
        TURNS.c.conversation_uid == bindparam("uid"),
        or_(TURNS.c.parent_turn_uid.is_not(None), TURNS.c.direct.is_(True)),
        TURNS.c.status.in_(ACTIVE_TURN_STATUSES),
    )
    .limit(2)
)
#: Statuses of a submitted root turn that has not started yet: queued in its lane, or its submission was lost.
UNSTARTED_STATUSES: Final = ("pending", "paused", "waiting")
_UNSTARTED_ROOT: Final = (
    TURNS.c.parent_turn_uid.is_(None),
    TURNS.c.submitted_at.is_not(None),
    TURNS.c.started_at.is_(None),
    TURNS.c.status.in_(UNSTARTED_STATUSES),
)
_KNOWN_TURN = TURNS.alias("known_turn")
_KNOWN_SUBMITTED = (
    select(_KNOWN_TURN.c.submitted_at).where(_KNOWN_TURN.c.uid == bindparam("known_uid")).scalar_subquery()
)
#: The lane's unstarted submitted turns (not ``ask``'s direct one) from the turn ``known_uid`` on (all of them when it
#: is unknown), oldest first: what a submission that the lane lost left behind (``StoreTx.unqueued_turns``).
UNQUEUED_TURNS: Final = (
    whole_rows(TurnRow)
    .where(
        TURNS.c.conversation_uid == bindparam("uid"),
        TURNS.c.direct.is_(False),
        *_UNSTARTED_ROOT,
        or_(_KNOWN_SUBMITTED.is_(None), TURNS.c.submitted_at >= _KNOWN_SUBMITTED),
    )
    .order_by(TURNS.c.submitted_at, TURNS.c.uid)
    .limit(bindparam("limit"))
)
#: Unstarted submitted root turns of every conversation submitted by ``before``, after the key ``(after_at,
#: after_uid)``, oldest first (``StoreTx.unstarted_turns``: a page of the workers' search for lost submissions).
UNSTARTED_TURNS: Final = (
    whole_rows(TurnRow)
    .where(
        *_UNSTARTED_ROOT,
        TURNS.c.submitted_at <= bindparam("before"),
        or_(
            TURNS.c.submitted_at > bindparam("after_at"),
            and_(TURNS.c.submitted_at == bindparam("after_at"), TURNS.c.uid > bindparam("after_uid")),
        ),
    )
    .order_by(TURNS.c.submitted_at, TURNS.c.uid)
    .limit(bindparam("limit"))
)
#: The turn ``uid`` if it exists, else any turn of the conversation ``conversation_uid``, else no row: a fresh
#: conversation's first turn asks both in one statement (``StoreTx.find_turn_or_any``).
TURN_OR_ANY_OF_CONVERSATION: Final = (
    whole_rows(TurnRow)
    .where(or_(TURNS.c.uid == bindparam("uid"), TURNS.c.conversation_uid == bindparam("conversation_uid")))
    .order_by(case((TURNS.c.uid == bindparam("uid"), 0), else_=1))
    .limit(1)
)
#: The turn ``uid`` if it exists, else an unfinished turn of the conversation ``conversation_uid``, else no row: an
#: idle conversation's next turn asks both in one statement (``StoreTx.find_turn_or_any``).
TURN_OR_UNFINISHED_OF_CONVERSATION: Final = (
    whole_rows(TurnRow)
    .where(
        or_(
            TURNS.c.uid == bindparam("uid"),
            and_(
                TURNS.c.conversation_uid == bindparam("conversation_uid"),
                # The unfinished statuses listed, not the terminal ones excluded: the (conversation, status) index
                # then looks each one up instead of reading every turn the conversation ever ran.
                TURNS.c.status.in_(CANCELLABLE_TURN_STATUSES),
            ),
        )
    )
    .order_by(case((TURNS.c.uid == bindparam("uid"), 0), else_=1))
    .limit(1)
)
TREE_USAGE: Final = select(
    TURNS.c.tree_iterations, TURNS.c.tree_tool_executions, TURNS.c.tree_tool_executions_by_name, TURNS.c.tree_cost
).where(TURNS.c.uid == bindparam("uid"))
#: What a turn write counts towards its root's totals: the root, the iterations (in ``options``) and the cost.
TURN_COUNTS: Final = select(TURNS.c.root_turn_uid, TURNS.c.options, TURNS.c.cost).where(TURNS.c.uid == bindparam("uid"))
TURN_COUNTS_LOCKED: Final = TURN_COUNTS.with_for_update()
_ROOT_OF_TURN = TURNS.alias("turn")
#: A turn's root and its by-name tool counts, found through the turn (bound ``uid``).
ROOT_TOOL_COUNTS: Final = select(TURNS.c.uid, TURNS.c.tree_tool_executions_by_name).where(
    TURNS.c.uid
    == select(_ROOT_OF_TURN.c.root_turn_uid).where(_ROOT_OF_TURN.c.uid == bindparam("uid")).scalar_subquery()
)
ROOT_TOOL_COUNTS_LOCKED: Final = ROOT_TOOL_COUNTS.with_for_update(of=TURNS)
TURN_RETURNING: Final = columns(TurnRow)


def tree_increments(iterations: int, cost: Decimal) -> dict[str, Any]:
    """The parameters of :func:`turn_update` that add to a root's ``tree_iterations`` and ``tree_cost`` (the cost
    rounded like a turn's); none for zero."""
    values: dict[str, Any] = {}
    if iterations:
        values["add_iterations"] = iterations
    if cost:
        values["add_cost"] = cost
    return values


def turn_update(params: Mapping[str, Any], *, cas: bool, returning: bool) -> Update:
    """UPDATE of the turn bound ``b_uid``, SET from the column keys of ``params`` (the parameters it is executed
    with); with ``cas``, only while its status is one of bound ``b_expected``. The :func:`tree_increments` among
    ``params`` add to the row's tree totals (a root's own write, or another turn's increments of it).
    ``returning``: the row as written."""
    return _turn_update(cas, "add_iterations" in params, "add_cost" in params, returning)


@functools.cache
def _turn_update(cas: bool, iterations: bool, cost: bool, returning: bool) -> Update:
    statement = update(TURNS).where(TURNS.c.uid == bindparam("b_uid"))
    if cas:
        statement = statement.where(TURNS.c.status.in_(bindparam("b_expected", expanding=True)))
    increments: dict[str, Any] = {}
    if iterations:
        increments["tree_iterations"] = TURNS.c.tree_iterations + bindparam(
            "add_iterations", type_=TURNS.c.tree_iterations.type
        )
    if cost:
        increments["tree_cost"] = func.round(TURNS.c.tree_cost + bindparam("add_cost", type_=TURNS.c.tree_cost.type), 6)
    if increments:
        statement = statement.values(**increments)
    return statement.returning(*TURN_RETURNING) if returning else statement


def turn_update_appending(params: Mapping[str, Any], *, new: bool) -> Update:
    """:func:`turn_update` (``returning``, no compare-and-set) with an append in the same statement (PostgreSQL; see
    "Writes fused into one statement" below): APPEND_MESSAGE, or with ``new=False`` APPEND_NEW_MESSAGE, its values
    bound as ``m_`` + each key. RETURNING adds the message's ``message_id`` and ``message_sequence`` (None when nothing
    was appended)."""
    return _turn_update_appending("add_iterations" in params, "add_cost" in params, new)


@functools.cache
def _turn_update_appending(iterations: bool, cost: bool, new: bool) -> Update:
    unless = () if new else (~exists().where(_EARLIER.c.uid == bindparam("m_uid")),)
    appended = _append(*unless, prefix="m_").cte("appended")
    return (
        _turn_update(False, iterations, cost, False)
        .add_cte(appended)
        .returning(
            *TURN_RETURNING,
            select(appended.c.id).scalar_subquery().label("message_id"),
            select(appended.c.sequence).scalar_subquery().label("message_sequence"),
        )
    )


#: Count ``add_tools`` executions more on the root bound ``b_uid``, with its by-name counts as bound ``by_name``.
COUNT_TOOL_EXECUTIONS: Final = (
    update(TURNS)
    .where(TURNS.c.uid == bindparam("b_uid"))
    .values(
        tree_tool_executions=TURNS.c.tree_tool_executions
        + bindparam("add_tools", type_=TURNS.c.tree_tool_executions.type),
        tree_tool_executions_by_name=bindparam("by_name", type_=TURNS.c.tree_tool_executions_by_name.type),
    )
)

# Tool executions ----------------------------------------------------------------------------------------------------

EXISTING_CALL_IDS: Final = select(TOOL_EXECUTIONS.c.tool_call_id).where(
    TOOL_EXECUTIONS.c.turn_uid == bindparam("turn_uid"),
    TOOL_EXECUTIONS.c.tool_call_id.in_(bindparam("ids", expanding=True)),
)
EXECUTION_COUNTED: Final = select(TOOL_EXECUTIONS.c.status, TOOL_EXECUTIONS.c.error).where(
    TOOL_EXECUTIONS.c.uid == bindparam("uid")
)
#: Compare-and-set of an execution (bound ``b_uid``, ``b_expected``), SET from the parameters' column keys.
CLAIM_EXECUTION: Final = update(TOOL_EXECUTIONS).where(
    TOOL_EXECUTIONS.c.uid == bindparam("b_uid"), TOOL_EXECUTIONS.c.status.in_(bindparam("b_expected", expanding=True))
)
CLAIM_EXECUTION_RETURNING: Final = CLAIM_EXECUTION.returning(*columns(ToolExecutionRow))

# Writes fused into one statement (PostgreSQL: one round trip where there were two) ----------------------------------
#
# Each is a data-modifying CTE whose second write runs only when the first wrote a row. All of a statement's parts
# read one snapshot, taken when it starts, and none sees what another part writes; so each is run only after the
# transaction holds the locks its parts depend on (the root turn's, and for an append the conversation's), as the two
# statements it replaces were: the snapshot then already holds every commit those locks wait for.
#
# Their values are bound with a prefix (``e_``, ``m_``, ``s_``): a parameter named as a column would also be compiled
# into an UPDATE's SET clause.


def _bound(table: Table, prefix: str) -> dict[str, Any]:
    """A bind parameter per column of ``table`` but its generated ``id``, named ``prefix`` + the column's key."""
    return {column.key: bindparam(prefix + column.key, type_=column.type) for column in table.c if column.key != "id"}


def _create_counted_execution() -> Select[int]:
    inserted = (
        postgresql.insert(TOOL_EXECUTIONS)
        .values(_bound(TOOL_EXECUTIONS, "e_"))
        .on_conflict_do_nothing()
        .returning(TOOL_EXECUTIONS.c.id)
        .cte("inserted")
    )
    counted = COUNT_TOOL_EXECUTIONS.where(exists(select(inserted.c.id))).returning(TURNS.c.id).cte("counted")
    return select(inserted.c.id).add_cte(counted)


#: A new execution (each column bound as ``e_`` + its key; a conflict on its natural key skips it) and, only when it
#: went in, its root's tool counts (bound as COUNT_TOOL_EXECUTIONS binds them): the new row's ``id``, or no row
#: (``StoreTx.create_tool_execution``).
CREATE_COUNTED_EXECUTION: Final = _create_counted_execution()


def _complete_execution_with_result() -> Select[*tuple[Any, ...]]:
    settled = (
        update(TOOL_EXECUTIONS)
        .where(
            TOOL_EXECUTIONS.c.uid == bindparam("b_uid"),
            TOOL_EXECUTIONS.c.status.in_(bindparam("b_expected", expanding=True)),
        )
        .values(
            {
                key: bindparam(f"s_{key}", type_=TOOL_EXECUTIONS.c[key].type)
                for key in ("status", "result", "completed_at", "updated_at")
            }
        )
        .returning(*columns(ToolExecutionRow))
        .cte("settled")
    )
    appended = _append(
        ~exists().where(_EARLIER.c.tool_execution_uid == bindparam("m_tool_execution_uid")),
        exists(select(settled.c.id)),
        prefix="m_",
    ).cte("appended")
    return select(
        *settled.c, appended.c.id.label("message_id"), appended.c.sequence.label("message_sequence")
    ).select_from(settled.outerjoin(appended, true()))


#: The compare-and-set of an execution to its result (bound ``b_uid``, ``b_expected``, and ``s_status``,
#: ``s_result``, ``s_completed_at``, ``s_updated_at``) and, only when it won, the append of its tool-result message
#: (bound as APPEND_FIRST_TOOL_RESULT binds it, each name prefixed ``m_``): the execution as written, with the
#: message's ``message_id`` and ``message_sequence`` (None when nothing was appended), or no row when the
#: compare-and-set lost (``StoreTx.complete_tool_execution``).
COMPLETE_EXECUTION_WITH_RESULT: Final = _complete_execution_with_result()

# Deliveries and staged inputs ---------------------------------------------------------------------------------------

MARK_DELIVERED: Final = update(DELIVERIES).where(
    DELIVERIES.c.uid == bindparam("b_uid"), DELIVERIES.c.delivered_at.is_(None)
)
DELETE_STAGED: Final[Delete] = delete(STAGED_INPUTS).where(STAGED_INPUTS.c.uid == bindparam("uid"))
