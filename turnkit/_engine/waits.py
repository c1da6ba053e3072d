"""Waits (behaviour §5.5): durable "turn X cannot proceed until turn Y is terminal" edges, and their wake-ups.

A waiting turn is a workflow blocked on a condition: it holds no worker slot. Its targets signal it when they end
(``target_finished``). No wake-up is lost: a target lists its waiters only after its terminal write committed, and
the waiter re-reads its targets after its edges committed (:func:`unfinished_targets`). If the target's listing
missed the edge, the edge committed after the listing, hence after the terminal write, and the re-read sees it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.service import RPCError

from turnkit._engine.server_away import while_server_away
from turnkit.kernel.errors import ToolError
from turnkit.kernel.names import TARGET_FINISHED_SIGNAL
from turnkit.kernel.records import WORKING_TURN_STATUSES, TurnRecord, WaitRecord
from turnkit.store.store import Store, StoreTx

__all__ = [
    "add_waits",
    "enter_waiting",
    "leave_waiting",
    "notify_waiters",
    "signal_waiters",
    "waiters_of",
]

#: How long a target's end keeps signalling a waiter while the Temporal server is away, after the client's own retries
#: (~10 s) gave up: a dev server restarted on its database file under load. A local store call that announces the end
#: outlasts its 10 s attempt then, and its regular activity announces again (idempotent).
WAKE_WINDOW = 30.0


class _Gone:
    terminal = True  # a target that no longer exists cannot be waited for


_GONE = _Gone()


async def add_waits(tx: StoreTx, turn: TurnRecord, target_ids: Sequence[str]) -> list[TurnRecord]:
    """Validate and create the edges ``turn → targets`` (all or none); returns the targets' records.

    Raises ``ToolError`` with TurnKit's messages: a turn waiting for itself, for work that was never submitted,
    for unfinished work in its own conversation (a serial lane would deadlock), or closing a cycle. The caller's
    transaction rolls back every edge on error. Open that transaction with ``store.atomic(wait_graph=True)`` so
    the store-wide wait-graph lock is taken before any row lock (else two opposite waits can deadlock).
    """
    await tx.lock_wait_graph()  # cycle checks and insertions are serialised store-wide
    targets: list[TurnRecord] = []
    for target_id in dict.fromkeys(target_ids):  # unique, in order
        if target_id == turn.id:
            raise ToolError("a turn cannot wait for itself")
        target = await tx.find_turn(target_id)
        if target is None:
            raise ToolError(f"unknown turn: {target_id}")
        if target.submitted_at is None and not target.terminal:
            raise ToolError("wait targets must be submitted")
        if target.conversation_id == turn.conversation_id and not target.terminal:
            raise ToolError("cannot wait for unfinished work in the same conversation")
        if await _reachable(tx, target, turn, visited=set()):
            raise ToolError("wait would create a cycle")
        await tx.create_wait(turn_id=turn.id, target_turn_id=target.id)
        targets.append(target)
    return targets


async def _reachable(tx: StoreTx, source: TurnRecord, sought: TurnRecord, *, visited: set[str]) -> bool:
    """Behaviour §5.5: can ``source`` reach ``sought``'s conversation through waits, treating conversations as lanes?"""
    if source.terminal:
        return False
    if source.conversation_id == sought.conversation_id:
        return True
    if source.conversation_id in visited:
        return False
    visited.add(source.conversation_id)
    for turn in await tx.list_turns(conversation_id=source.conversation_id):
        if turn.terminal:
            continue
        for edge in await tx.list_waits(turn_id=turn.id):
            target = await tx.find_turn(edge.target_turn_id)
            if target is not None and await _reachable(tx, target, sought, visited=visited):
                return True
    return False


async def enter_waiting(tx: StoreTx, turn_id: str, target_ids: Sequence[str]) -> TurnRecord:
    """The turn now waits on ``target_ids`` (its children, or wait targets): status ``waiting`` (behaviour §1.6).

    ``state.waiting_on`` remembers the targets, so a turn paused while it waits resumes to ``waiting``, not
    ``pending``. A paused turn stays paused; a finished one is left alone.
    """
    turn = await tx.load_turn(turn_id)
    if turn.terminal or not target_ids:
        return turn
    options = turn.options.with_state(turn.state.model_copy(update={"waiting_on": list(target_ids)}))
    moved = await tx.claim_turn(turn.id, from_=WORKING_TURN_STATUSES, to="waiting", options=options)
    return moved or await tx.update_turn(turn.id, options=options)


async def leave_waiting(tx: StoreTx, turn_id: str) -> TurnRecord:
    """The turn's targets have ended: ``waiting`` becomes ``running`` again (a pause requested meanwhile stays)."""
    turn = await tx.load_turn(turn_id)
    if turn.terminal or turn.options.state.waiting_on is None:
        return turn
    options = turn.options.with_state(turn.state.model_copy(update={"waiting_on": None}))
    moved = await tx.claim_turn(turn.id, from_="waiting", to="running", options=options)
    return moved or await tx.update_turn(turn.id, options=options)


async def unfinished_targets(store: Store, target_ids: Sequence[str]) -> list[str]:
    """The targets not terminal yet, read after the edges committed (see the module docstring)."""
    async with store.atomic() as tx:
        return [t for t in target_ids if not ((await tx.find_turn(t)) or _GONE).terminal]


async def notify_waiters(store: Store, client: Client, turn_id: str) -> None:
    """Signal every turn waiting on ``turn_id`` (after its terminal write committed); idempotent."""
    async with store.atomic() as tx:
        edges = await waiters_of(tx, turn_id)
    await signal_waiters(client, turn_id, edges)


async def waiters_of(tx: StoreTx, turn_id: str) -> list[WaitRecord]:
    """The edges of the turns waiting on ``turn_id``, read once its terminal write committed; [] while it is not
    terminal (or gone): its end will list them then."""
    turn = await tx.find_turn(turn_id)
    if turn is None or not turn.terminal:
        return []
    return await tx.list_waits(target_turn_id=turn_id)


async def signal_waiters(client: Client, turn_id: str, edges: Sequence[WaitRecord]) -> None:
    """Signal ``target_finished`` to the waiter of each of ``edges`` (read by :func:`waiters_of`).

    A server that is away (a restart) is waited out for up to :data:`WAKE_WINDOW`: a lost wake-up would leave a lane
    following the turn idle until its next look at the store (a minute), and a waiting turn until its next check.
    Other refusals mean the waiter finished, or never started: nothing to wake.
    """
    for edge in edges:
        signal = functools.partial(client.get_workflow_handle(edge.turn_id).signal, TARGET_FINISHED_SIGNAL, turn_id)
        with contextlib.suppress(RPCError):
            await while_server_away(signal, window=WAKE_WINDOW)
