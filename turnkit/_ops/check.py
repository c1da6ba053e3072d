"""``turnkit check``: report every broken invariant of behaviour §5.13 found in the store and in Temporal.

The store and Temporal are read, never written. Each :class:`Finding` names a kind, the ids involved and one
sentence. Most checks are set-based SQL; Temporal is asked only about the turns that are not terminal (and the
turns that still have an open tool execution), with bounded concurrency, so a store of thousands of finished turns
costs a few queries. ``since`` limits the check to records created or changed since then.

Work in flight is not a violation: a finding about something that may still be moving (a pending child turn whose
parent has not started it yet, a delivery its lane has not applied yet, a waiter whose wake-up is on its way) is
only reported once it is older than ``grace`` seconds. With every root turn terminal, ``grace=0`` is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

from sqlalchemy import Text, cast, func, or_, select
from temporalio.api.enums.v1 import PendingWorkflowTaskState
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from turnkit._engine.budget import counts_against_budget, limits_of
from turnkit.kernel.payloads import LaneStatus
from turnkit.kernel.records import ACTIVE_TURN_STATUSES, TERMINAL_TURN_STATUSES, ToolExecutionRecord, TurnRecord
from turnkit.store.rows import tool_execution_record, turn_record
from turnkit.store.schema import DeliveryRow, MessageRow, ToolExecutionRow, TurnRow
from turnkit.store.statements import whole_rows
from turnkit.store.store import Store, utcnow

__all__ = [
    "ACTIVE_TURNS",
    "DELIVERY_CONSUMED_TWICE",
    "DELIVERY_NOT_CONSUMED",
    "DELIVERY_WITHOUT_MESSAGE",
    "EXECUTION_WITHOUT_ATTEMPT",
    "IN_FLIGHT",
    "OVER_BUDGET",
    "SEQUENCE_GAP",
    "TOOL_CALL_RESULTS",
    "TURNS_OUT_OF_ORDER",
    "TURN_WITHOUT_WORKFLOW",
    "UNANSWERED",
    "WAIT_WITHOUT_END",
    "WORKFLOW_CLOSED",
    "WRITE_AFTER_REVOCATION",
    "Finding",
    "Liveness",
    "check",
    "held_by_lane",
    "lane_statuses",
    "workflow_states",
]

ACTIVE_TURNS: Final = "multiple_active_turns"
SEQUENCE_GAP: Final = "sequence_gap"
TOOL_CALL_RESULTS: Final = "tool_call_results"
EXECUTION_WITHOUT_ATTEMPT: Final = "execution_without_attempt"
TURN_WITHOUT_WORKFLOW: Final = "turn_without_workflow"
WORKFLOW_CLOSED: Final = "workflow_closed"
DELIVERY_CONSUMED_TWICE: Final = "delivery_consumed_twice"
DELIVERY_WITHOUT_MESSAGE: Final = "delivery_without_message"
DELIVERY_NOT_CONSUMED: Final = "delivery_not_consumed"
WAIT_WITHOUT_END: Final = "wait_without_end"
OVER_BUDGET: Final = "tree_over_budget"
TURNS_OUT_OF_ORDER: Final = "turns_out_of_order"
WRITE_AFTER_REVOCATION: Final = "write_after_revocation"

#: Workflow state of a turn or lane id: "running", "missing" (never started), or the closed status in lowercase.
Liveness = str
_DESCRIBE_CONCURRENCY: Final = 32
#: A lane that does not answer its status query in time (no worker polls its task queue) holds nothing we know of.
_QUERY_TIMEOUT: Final = 5.0
T = TypeVar("T")


@dataclass(frozen=True)
class Finding:
    """One broken invariant: its kind, the ids it concerns, and a sentence saying what is wrong."""

    kind: str
    ids: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{self.kind} [{', '.join(self.ids)}]: {self.message}"


@dataclass
class _Context:
    store: Store
    client: Client
    since: datetime | None
    cutoff: datetime
    findings: list[Finding] = field(default_factory=list)

    def add(self, kind: str, ids: Iterable[str], message: str) -> None:
        self.findings.append(Finding(kind, tuple(ids), message))


async def check(store: Store, client: Client, *, since: datetime | None = None, grace: float = 10.0) -> list[Finding]:
    """Every broken invariant in the store and Temporal (empty when all is well); see the module docstring."""
    ctx = _Context(store, client, since, utcnow() - timedelta(seconds=grace))
    await _active_turns(ctx)
    await _turn_order(ctx)
    await _sequence_gaps(ctx)
    await _tool_call_results(ctx)
    await _writes_after_revocation(ctx)
    await _workflows(ctx)
    await _deliveries(ctx)
    await _waits(ctx)
    await _budgets(ctx)
    return ctx.findings


def _recent(column: Any, ctx: _Context) -> Any:
    return column >= ctx.since if ctx.since is not None else True


# Store-only checks -------------------------------------------------------------------------------------------------


async def _active_turns(ctx: _Context) -> None:
    """Behaviour §5.13.1: at most one running, waiting or (started and) paused turn per conversation."""
    started_paused = (TurnRow.status == "paused") & TurnRow.started_at.is_not(None)
    # A prepared (unsubmitted) turn that waits for others runs nothing yet: it is not active.
    submitted_waiting = (TurnRow.status == "waiting") & TurnRow.submitted_at.is_not(None)
    active = or_(TurnRow.status == "running", submitted_waiting, started_paused)
    query = select(TurnRow.conversation_uid, TurnRow.uid).where(active, _recent(TurnRow.updated_at, ctx))
    async with ctx.store.atomic() as tx:
        rows = (await tx.connection.execute(query.order_by(TurnRow.created_at, TurnRow.id))).all()
    by_conversation: dict[str, list[str]] = defaultdict(list)
    for conversation_id, turn_id in rows:
        by_conversation[conversation_id].append(turn_id)
    for conversation_id, turns in by_conversation.items():
        if len(turns) > 1:
            ctx.add(ACTIVE_TURNS, [conversation_id, *turns], f"{len(turns)} turns are active in one conversation")


async def _turn_order(ctx: _Context) -> None:
    """A conversation's submitted root turns run one at a time in submission order (``submitted_at``): every model
    message of a turn comes after those of the turns submitted before it (message sequences, not clocks), and no turn
    runs while one submitted before it has not started (a lost submission overtaken; docs/design.md, "Lost
    submissions"). Sub-agent turns, prepared and standalone turns are not in the lane's order."""
    roots = select(
        TurnRow.conversation_uid, TurnRow.uid, TurnRow.status, TurnRow.started_at, TurnRow.submitted_at
    ).where(TurnRow.parent_turn_uid.is_(None), TurnRow.submitted_at.is_not(None))
    if ctx.since is not None:
        touched = select(TurnRow.conversation_uid).where(TurnRow.updated_at >= ctx.since)
        roots = roots.where(TurnRow.conversation_uid.in_(touched))
    spans_query = (
        select(MessageRow.turn_uid, func.min(MessageRow.sequence), func.max(MessageRow.sequence))
        # The model's messages: what a turn writes only while it runs (a repair appends tool results to an ended one).
        .where(MessageRow.role == "assistant", MessageRow.turn_uid.in_(roots.with_only_columns(TurnRow.uid)))
        .group_by(MessageRow.turn_uid)
    )
    async with ctx.store.atomic() as tx:
        rows = (await tx.connection.execute(roots.order_by(TurnRow.submitted_at, TurnRow.uid))).all()
        spans = {turn_id: (low, high) for turn_id, low, high in await tx.connection.execute(spans_query)}
    by_conversation: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        by_conversation[row.conversation_uid].append(row)
    for conversation_id, turns in by_conversation.items():
        last: tuple[int, str] | None = None  # the highest sequence written by a turn submitted earlier, and that turn
        unstarted: str | None = None  # an earlier turn that has not run and may still have to
        for turn in turns:
            span = spans.get(turn.uid)
            if span is None:
                if turn.status not in TERMINAL_TURN_STATUSES and turn.started_at is None and unstarted is None:
                    unstarted = turn.uid
                continue
            if last is not None and span[0] < last[0]:
                ctx.add(
                    TURNS_OUT_OF_ORDER,
                    [conversation_id, last[1], turn.uid],
                    f"{turn.uid} answered (message {span[0]}) before {last[1]}, submitted earlier (message {last[0]})",
                )
            if unstarted is not None:
                ctx.add(
                    TURNS_OUT_OF_ORDER,
                    [conversation_id, unstarted, turn.uid],
                    f"{turn.uid} ran while {unstarted}, submitted earlier, had not started",
                )
                unstarted = None
            if last is None or span[1] > last[0]:
                last = (span[1], turn.uid)


async def _sequence_gaps(ctx: _Context) -> None:
    """Message sequences of a conversation are 1..n without gaps or repeats."""
    query = select(
        MessageRow.conversation_uid,
        func.count(),
        func.count(func.distinct(MessageRow.sequence)),
        func.min(MessageRow.sequence),
        func.max(MessageRow.sequence),
    ).group_by(MessageRow.conversation_uid)
    if ctx.since is not None:
        touched = select(MessageRow.conversation_uid).where(MessageRow.created_at >= ctx.since)
        query = query.where(MessageRow.conversation_uid.in_(touched))
    async with ctx.store.atomic() as tx:
        rows = (await tx.connection.execute(query)).all()
    for conversation_id, count, distinct, low, high in rows:
        if count != distinct or low != 1 or high != count:
            ctx.add(SEQUENCE_GAP, [conversation_id], f"{count} messages with sequences {low}..{high}")


async def _tool_call_results(ctx: _Context) -> None:
    """Behaviour §5.13.8: every tool call of a finished turn has exactly one result; no call has two, ever."""
    turn_query = select(TurnRow.uid, TurnRow.status).where(_recent(TurnRow.updated_at, ctx))
    async with ctx.store.atomic() as tx:
        statuses = dict((await tx.connection.execute(turn_query)).all())
        message_query = select(MessageRow.turn_uid, MessageRow.role, MessageRow.content).where(
            MessageRow.role.in_(("assistant", "tool")), MessageRow.turn_uid.is_not(None)
        )
        if ctx.since is not None:
            message_query = message_query.where(MessageRow.turn_uid.in_(turn_query.with_only_columns(TurnRow.uid)))
        messages = (await tx.connection.execute(message_query)).all()
    calls: dict[str, list[str]] = defaultdict(list)
    results: dict[str, Counter[str]] = defaultdict(Counter)
    for turn_id, role, content in messages:
        for part in _parts(content):
            if role == "assistant" and part.get("type") == "tool_call":
                calls[str(turn_id)].append(str(part.get("id")))
            elif role == "tool" and part.get("type") == "tool_result":
                results[str(turn_id)][str(part.get("tool_call_id"))] += 1
    for turn_id in set(calls) | set(results):
        status = statuses.get(turn_id)
        if status is None:
            continue
        proposed = Counter(calls.get(turn_id, []))
        for call_id, times in proposed.items():
            got = results[turn_id][call_id]
            if times > 1:
                ctx.add(TOOL_CALL_RESULTS, [turn_id, call_id], f"tool-call id proposed {times} times in one turn")
            if got > 1:
                ctx.add(TOOL_CALL_RESULTS, [turn_id, call_id], f"tool call has {got} results")
            elif got == 0 and status in TERMINAL_TURN_STATUSES:
                ctx.add(TOOL_CALL_RESULTS, [turn_id, call_id], f"tool call of a {status} turn has no result")


async def _writes_after_revocation(ctx: _Context) -> None:
    """No write after revocation (behaviour §5.4, T49): a message a tool wrote through its context (its metadata
    names the execution) comes before its execution's tool result in the conversation, and before every message of
    a turn of that conversation that started after the execution's turn ended. Sequences, not clocks, order the
    writes; turns' own start and end times only pick the turns that ran later, which the lane orders."""
    writes_query = select(MessageRow.uid, MessageRow.conversation_uid, MessageRow.sequence, MessageRow.metadata_).where(
        MessageRow.role == "user",
        MessageRow.turn_uid.is_(None),
        cast(MessageRow.metadata_, Text).like('%"tool_execution_id"%'),
        _recent(MessageRow.created_at, ctx),
    )
    async with ctx.store.atomic() as tx:
        writes = [
            (uid, conversation_id, sequence, str(_mapping(metadata).get("tool_execution_id")))
            for uid, conversation_id, sequence, metadata in await tx.connection.execute(writes_query)
        ]
        if not writes:
            return
        execution_ids = {execution_id for *_, execution_id in writes}
        turn_of = dict(
            (
                await tx.connection.execute(
                    select(ToolExecutionRow.uid, ToolExecutionRow.turn_uid).where(
                        ToolExecutionRow.uid.in_(execution_ids)
                    )
                )
            ).all()
        )
        results = dict(
            (
                await tx.connection.execute(
                    select(MessageRow.tool_execution_uid, func.min(MessageRow.sequence))
                    .where(MessageRow.role == "tool", MessageRow.tool_execution_uid.in_(execution_ids))
                    .group_by(MessageRow.tool_execution_uid)
                )
            ).all()
        )
        conversations = {conversation_id for _, conversation_id, *_ in writes}
        turns = (
            await tx.connection.execute(
                select(TurnRow.uid, TurnRow.conversation_uid, TurnRow.started_at, TurnRow.completed_at).where(
                    TurnRow.conversation_uid.in_(conversations)
                )
            )
        ).all()
        first_messages = dict(
            (
                await tx.connection.execute(
                    select(MessageRow.turn_uid, func.min(MessageRow.sequence))
                    # The model's messages: a turn's user message is written when it is submitted, maybe while the
                    # tool still ran.
                    .where(MessageRow.conversation_uid.in_(conversations), MessageRow.role == "assistant")
                    .group_by(MessageRow.turn_uid)
                )
            ).all()
        )
    ended = {row.uid: row.completed_at for row in turns}
    for uid, conversation_id, sequence, execution_id in writes:
        result = results.get(execution_id)
        if result is not None and sequence > result:
            ctx.add(
                WRITE_AFTER_REVOCATION,
                [execution_id, uid],
                f"message {sequence} was written by the tool after its result (message {result})",
            )
            continue
        turn_id = turn_of.get(execution_id)
        end = ended.get(turn_id) if turn_id is not None else None
        if end is None:
            continue
        later = [
            first_messages[row.uid]
            for row in turns
            if row.conversation_uid == conversation_id
            and row.uid != turn_id
            and row.started_at is not None
            and row.started_at >= end
            and row.uid in first_messages
        ]
        if later and sequence > min(later):
            ctx.add(
                WRITE_AFTER_REVOCATION,
                [execution_id, uid],
                f"message {sequence} was written by the tool after its turn {turn_id} ended (a later turn wrote "
                f"message {min(later)})",
            )


def _mapping(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # some drivers hand JSON back as text
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def _parts(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):  # some drivers hand JSON back as text
        content = json.loads(content)
    return [part for part in content or [] if isinstance(part, dict)]


# Checks against Temporal -------------------------------------------------------------------------------------------


async def _for_each(ids: Iterable[str], ask: Callable[[str], Awaitable[T]]) -> dict[str, T]:
    """``ask`` about each distinct id, at most ``_DESCRIBE_CONCURRENCY`` at a time."""
    limit = asyncio.Semaphore(_DESCRIBE_CONCURRENCY)
    distinct = list(dict.fromkeys(ids))

    async def one(key: str) -> T:
        async with limit:
            return await ask(key)

    return dict(zip(distinct, await asyncio.gather(*(one(key) for key in distinct)), strict=True))


async def _describe(client: Client, workflow_id: str) -> WorkflowExecutionDescription | None:
    """The workflow's description; None when it does not exist."""
    try:
        return await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def workflow_states(client: Client, workflow_ids: Iterable[str]) -> dict[str, Liveness]:
    """Describe each workflow id (bounded concurrency): ``running``, ``missing`` or its closed status."""

    async def one(workflow_id: str) -> Liveness:
        described = await _describe(client, workflow_id)
        if described is None:
            return "missing"
        return (described.status or WorkflowExecutionStatus.RUNNING).name.lower()

    return await _for_each(workflow_ids, one)


#: A running lane that does not answer its status query in time (no worker serves its task queue right now).
UNANSWERED: Final = "unanswered"
#: A running lane with a workflow task in flight, not yet failing: its history may hold what its status query cannot
#: show yet (a store call's result that names a turn it is about to run), so it may hold any of its root turns.
IN_FLIGHT: Final = "in_flight"
#: A lane whose workflow task has been tried more often than this is failing, not in flight (a server restart or a
#: killed worker costs one timed-out attempt each).
_IN_FLIGHT_ATTEMPTS: Final = 3
#: A workflow task scheduled this long ago and not started has no worker polling for it (a workflow task's timeout).
_UNPOLLED_AFTER: Final = timedelta(seconds=10)


async def lane_statuses(client: Client, conversation_ids: Iterable[str]) -> dict[str, LaneStatus | str | None]:
    """The ``status`` query of each running lane; None for a lane that is not running, :data:`IN_FLIGHT` for one
    whose workflow task is in flight, :data:`UNANSWERED` for a running lane that does not answer.

    A status query answers from the lane's last *completed* workflow task. A task in flight (or timed out with a
    restarted server, to be tried again) may be about to act on what its history already holds: a woken turn that a
    store call committed and returned, which the lane will queue and start once the task completes
    (docs/design.md, "Deliveries"). So such a lane is not asked: it may hold any of its turns for now.
    """

    async def one(conversation_id: str) -> LaneStatus | str | None:
        described = await _describe(client, conversation_id)
        if described is None or described.status not in (None, WorkflowExecutionStatus.RUNNING):
            return None
        if _task_in_flight(described.raw_description):
            return IN_FLIGHT
        with contextlib.suppress(RPCError, TimeoutError):
            async with asyncio.timeout(_QUERY_TIMEOUT):
                handle = client.get_workflow_handle(conversation_id)
                return await handle.query("status", result_type=LaneStatus)
        return UNANSWERED

    return await _for_each(conversation_ids, one)


def _task_in_flight(raw: DescribeWorkflowExecutionResponse) -> bool:
    """Whether the lane's workflow task is in flight: started (by a worker, or before a server restart: it completes
    or times out and is tried again), or scheduled a moment ago; and not failing. A task scheduled longer ago than a
    workflow task's timeout has no worker to run it: the lane is asked then (and does not answer)."""
    if not raw.HasField("pending_workflow_task"):
        return False
    task = raw.pending_workflow_task
    if task.attempt > _IN_FLIGHT_ATTEMPTS:
        return False
    if task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED:
        return True
    waited = datetime.now(UTC) - task.scheduled_time.ToDatetime(UTC)
    return waited < _UNPOLLED_AFTER


def held_by_lane(turn: TurnRecord, lanes: dict[str, LaneStatus | str | None]) -> bool:
    """Whether the conversation's running lane has ``turn`` queued or active (a root turn waiting its turn), or may
    have it (:data:`IN_FLIGHT`: its workflow task in flight may be about to queue it)."""
    lane = lanes.get(turn.conversation_id)
    if lane == IN_FLIGHT:
        return True
    return isinstance(lane, LaneStatus) and (turn.id in lane.queued_turn_ids or turn.id == lane.active_turn_id)


async def _workflows(ctx: _Context) -> None:
    """Unfinished turns need a live workflow (or a place in their lane's queue); open executions a live turn."""
    async with ctx.store.atomic() as tx:
        # Prepared turns (built, not submitted) are not work in flight: nothing is meant to run them yet.
        unfinished = whole_rows(TurnRow).where(
            TurnRow.status.in_(ACTIVE_TURN_STATUSES),
            or_(TurnRow.submitted_at.is_not(None), TurnRow.status == "running"),
            _recent(TurnRow.updated_at, ctx),
        )
        turns = [turn_record(row) for row in await tx.connection.execute(unfinished)]
        running = whole_rows(ToolExecutionRow).where(
            ToolExecutionRow.status == "running", _recent(ToolExecutionRow.updated_at, ctx)
        )
        open_executions = [tool_execution_record(row) for row in await tx.connection.execute(running)]
    states = await workflow_states(ctx.client, [t.id for t in turns] + [e.turn_id for e in open_executions])
    roots = [t for t in turns if t.parent_turn_id is None and states[t.id] != "running"]
    lanes = await lane_statuses(ctx.client, [t.conversation_id for t in roots])
    suspects = [t for t in turns if states[t.id] != "running" and not held_by_lane(t, lanes)]
    moved = await _moved_since(ctx, suspects, [e for e in open_executions if states[e.turn_id] != "running"])
    for turn in suspects:
        state = states[turn.id]
        if turn.id in moved:
            continue
        if state != "missing":
            ctx.add(WORKFLOW_CLOSED, [turn.id], f"turn is {turn.status} but its workflow is {state}")
        elif turn.updated_at <= ctx.cutoff:
            where = "" if turn.parent_turn_id else " nor queued in its conversation's lane"
            if lanes.get(turn.conversation_id) == UNANSWERED:
                where += " (the lane does not answer its status query: no worker?)"
            ctx.add(TURN_WITHOUT_WORKFLOW, [turn.id], f"turn is {turn.status} with no workflow{where}")
    for execution in open_executions:
        state = states[execution.turn_id]
        if state != "running" and execution.id not in moved:
            ctx.add(
                EXECUTION_WITHOUT_ATTEMPT,
                [execution.id, execution.turn_id],
                f"tool execution {execution.tool_name} is running but its turn's workflow is {state}",
            )


async def _moved_since(ctx: _Context, turns: list[TurnRecord], executions: list[ToolExecutionRecord]) -> set[str]:
    """The ids among ``turns`` and ``executions`` whose record changed after it was read: read again now, after
    Temporal was asked about them.

    The records were read before their workflows were described. A turn writes its terminal record before its
    workflow closes, and a lane starts a queued turn before it forgets it, so a turn that ended (or started) between
    the two reads looks like one whose workflow closed under a running record, or one no workflow and no lane holds.
    Judged on a record read after Temporal's answer, it is what it is: moving, so not a finding.
    """
    if not turns and not executions:
        return set()
    async with ctx.store.reads() as tx:
        now = {
            row.uid: row.updated_at
            for row in await tx.connection.execute(
                select(TurnRow.uid, TurnRow.updated_at).where(TurnRow.uid.in_([t.id for t in turns]))
            )
        }
        now.update(
            (row.uid, row.updated_at)
            for row in await tx.connection.execute(
                select(ToolExecutionRow.uid, ToolExecutionRow.updated_at).where(
                    ToolExecutionRow.uid.in_([e.id for e in executions])
                )
            )
        )
    return {record.id for record in [*turns, *executions] if now.get(record.id) != record.updated_at}


async def _deliveries(ctx: _Context) -> None:
    """Behaviour §5.13.7: each delivery is appended exactly once; a pending one is held by its lane or on its way."""
    async with ctx.store.atomic() as tx:
        deliveries = (
            await tx.connection.execute(
                select(
                    DeliveryRow.uid,
                    DeliveryRow.destination_conversation_uid,
                    DeliveryRow.message_uid,
                    DeliveryRow.delivered_at,
                    DeliveryRow.created_at,
                ).where(_recent(DeliveryRow.updated_at, ctx))
            )
        ).all()
        # Messages that carry a delivery: user messages appended by the lane (metadata.delivery_id).
        carried = (
            await tx.connection.execute(
                select(MessageRow.uid, MessageRow.metadata_).where(
                    MessageRow.role == "user", _recent(MessageRow.created_at, ctx)
                )
            )
        ).all()
    appended: dict[str, list[str]] = defaultdict(list)
    for message_id, metadata in carried:
        meta = json.loads(metadata) if isinstance(metadata, str) else metadata or {}
        if meta.get("delivery_id"):
            appended[str(meta["delivery_id"])].append(message_id)
    waiting: list[tuple[str, str]] = []
    for delivery_id, destination, message_id, delivered_at, created_at in deliveries:
        messages = appended.get(delivery_id, [])
        if len(messages) > 1:
            ctx.add(DELIVERY_CONSUMED_TWICE, [delivery_id, *messages], f"delivery appended {len(messages)} times")
        if delivered_at is not None and (message_id is None or message_id not in messages):
            if ctx.since is None or message_id is None:
                ctx.add(DELIVERY_WITHOUT_MESSAGE, [delivery_id], "delivery marked delivered but its message is missing")
        elif delivered_at is None and created_at <= ctx.cutoff:
            waiting.append((delivery_id, destination))
    if not waiting:
        return
    lanes = await lane_statuses(ctx.client, [destination for _, destination in waiting])
    unheld = [
        (delivery_id, destination)
        for delivery_id, destination in waiting
        if lanes.get(destination) != UNANSWERED  # a lane no worker serves right now may hold it: nothing to say yet
        and not (isinstance(lane := lanes.get(destination), LaneStatus) and delivery_id in lane.pending_delivery_ids)
    ]
    if not unheld:
        return
    # Read again after the lanes answered: one applied meanwhile left its lane's pending list (see _moved_since).
    async with ctx.store.reads() as tx:
        applied = set(
            (
                await tx.connection.execute(
                    select(DeliveryRow.uid).where(
                        DeliveryRow.uid.in_([d for d, _ in unheld]), DeliveryRow.delivered_at.is_not(None)
                    )
                )
            ).scalars()
        )
    for delivery_id, destination in unheld:
        if delivery_id not in applied:
            ctx.add(DELIVERY_NOT_CONSUMED, [delivery_id, destination], "pending delivery that no lane holds")


async def _waits(ctx: _Context) -> None:
    """A waiting turn whose targets all ended (and long enough ago for its wake-up to land) waits for nothing."""
    async with ctx.store.atomic() as tx:
        waiting = whole_rows(TurnRow).where(TurnRow.status == "waiting", _recent(TurnRow.updated_at, ctx))
        waiters = [turn_record(row) for row in await tx.connection.execute(waiting)]
        target_ids = {t for w in waiters for t in w.options.state.waiting_on or []}
        targets = {
            row.uid: turn_record(row)
            for row in await tx.connection.execute(whole_rows(TurnRow).where(TurnRow.uid.in_(list(target_ids))))
        }
    for waiter in waiters:
        waiting_on = list(waiter.options.state.waiting_on or [])
        ended = [targets.get(t) for t in waiting_on]
        if not waiting_on or not all(t is not None and t.terminal for t in ended):
            continue
        last = max((t.updated_at for t in ended if t is not None), default=waiter.updated_at)
        if last <= ctx.cutoff and waiter.updated_at <= ctx.cutoff:
            ctx.add(WAIT_WITHOUT_END, [waiter.id, *waiting_on], "turn still waits although every target has ended")


async def _budgets(ctx: _Context) -> None:
    """Behaviour §5.13.10: iterations and tool executions of a root tree stay within the root's limits."""
    root_ids = select(TurnRow.uid).where(TurnRow.parent_turn_uid.is_(None), _recent(TurnRow.updated_at, ctx))
    async with ctx.store.atomic() as tx:
        trees: dict[str, list[TurnRecord]] = defaultdict(list)
        for row in await tx.connection.execute(whole_rows(TurnRow).where(TurnRow.root_turn_uid.in_(root_ids))):
            trees[row.root_turn_uid].append(turn_record(row))
        roots = {root_id: turn for root_id, tree in trees.items() for turn in tree if turn.id == root_id}
        tree_of = {turn.id: root_id for root_id, tree in trees.items() for turn in tree}
        in_trees = select(TurnRow.uid).where(TurnRow.root_turn_uid.in_(root_ids))
        executions = [
            tool_execution_record(row)
            for row in await tx.connection.execute(
                whole_rows(ToolExecutionRow).where(ToolExecutionRow.turn_uid.in_(in_trees))
            )
        ]
    counted: dict[str, list[str]] = defaultdict(list)
    for execution in executions:
        if counts_against_budget(execution):
            counted[tree_of[execution.turn_id]].append(execution.tool_name)
    for root_id, root in roots.items():
        limits = limits_of(root)
        iterations = sum(t.options.state.iterations for t in trees[root_id])
        if limits.max_iterations is not None and iterations > limits.max_iterations:
            ctx.add(OVER_BUDGET, [root_id], f"{iterations} iterations over a limit of {limits.max_iterations}")
        names = counted[root_id]
        if limits.max_tool_executions is not None and len(names) > limits.max_tool_executions:
            ctx.add(
                OVER_BUDGET, [root_id], f"{len(names)} tool executions over a limit of {limits.max_tool_executions}"
            )
        for name, limit in limits.max_tool_executions_by_name.items():
            used = names.count(name)
            if limit is not None and used > limit:
                ctx.add(OVER_BUDGET, [root_id], f"{used} executions of {name} over a limit of {limit}")


def summary(findings: Sequence[Finding]) -> str:
    """One line per finding, or a line saying that every invariant holds."""
    if not findings:
        return "ok: every invariant holds"
    return "\n".join(str(f) for f in findings)
