"""A human control's writes (behaviour §5.9, §5.10), and a cancel's end to end: what ``Turn.pause`` … ``Turn.cancel``
and the cancel workflow's activities run.

:func:`write_control` authorises every selected turn (outside the write transaction), then applies the control to
all of them in one transaction under the root's lock. A cancel is two steps that the cancel workflow runs as
activities, each idempotent (docs/design.md, "No side doors"): :func:`cancel_turns` (the writes, with each cancelled
turn's completion delivery) and :func:`announce_cancel` (the turns' workflows cancelled, then each end announced as
any turn end is: callback, waiters, lane).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from temporalio.client import Client
from temporalio.service import RPCError

from turnkit._engine.authorization import Action, Verdict, authorize
from turnkit._engine.controls import apply_cancel, selected_turns
from turnkit._engine.deliveries import callback_verdict, completion_delivery
from turnkit._engine.server_away import SERVER_AWAY
from turnkit._engine.turn_end import announce_end
from turnkit.kernel.records import TurnRecord
from turnkit.store.store import Store, StoreTx

__all__ = ["announce_cancel", "cancel_turns", "write_control"]


async def write_control(
    store: Store,
    turn_id: str,
    action: Action,
    descendants: str,
    principal: object,
    apply: Callable[[StoreTx, TurnRecord], Awaitable[TurnRecord]],
    *,
    skip_finished: bool = True,
) -> list[TurnRecord]:
    """Apply ``action`` to the turn (and its descendants, cascading) once every selected turn is authorised; the
    changed records, without the finished ones when ``skip_finished``.

    Raises:
        AuthorizationError: The hook denied a selected turn (nothing is written).
        ValueError: ``descendants`` is neither ``"retain"`` nor ``"cascade"``.
    """
    root = (await store.load_turn(turn_id)).root_turn_id
    callbacks: dict[str, Verdict] = {}  # the turns asked about, with their completion callback's verdict
    while True:
        # Every selected turn is authorised before any change (behaviour §5.10), outside the write transaction.
        async with store.atomic() as tx:
            selected = await selected_turns(tx, await tx.load_turn(turn_id), descendants)
        for each in selected:
            if each.id not in callbacks:
                await authorize(action, principal, turn=each, descendants=descendants)
                callbacks[each.id] = await callback_verdict(each) if action == "cancel" else Verdict(action, True)
        async with store.atomic(turn_id=root) as tx:
            turn = await tx.load_turn(turn_id)
            selected = await selected_turns(tx, turn, descendants)
            if any(each.id not in callbacks for each in selected):
                continue  # a child was created meanwhile: ask about it too, then select again
            changed = [await apply(tx, each) for each in selected]
            if action == "cancel":
                for each in changed:
                    if each.status == "cancelled" and each.submitted_at is not None:
                        await completion_delivery(tx, each, callbacks[each.id])
        return [t for t in changed if not skip_finished or t.status not in ("completed", "failed")]


async def cancel_turns(store: Store, turn_id: str, descendants: str, principal: object) -> list[TurnRecord]:
    """End the turn (and its descendants, cascading) ``cancelled``; the selected turns that are cancelled now.

    Idempotent: run again, it finds them cancelled, writes nothing and returns them again (so a retried step still
    announces their end)."""
    return await write_control(store, turn_id, "cancel", descendants, principal, apply_cancel)


async def announce_cancel(store: Store, client: Client, task_queue: str, turn_ids: Sequence[str]) -> None:
    """After :func:`cancel_turns` committed: cancel each turn's workflow (running calls are cancelled with it), then
    announce its end (callback delivery, waiters, a sub-agent's lane). Idempotent.

    A workflow that does not exist (a queued or prepared turn) or has closed needs no cancel; a server that is away
    raises, and the step is retried.
    """
    for turn_id in turn_ids:
        try:
            await client.get_workflow_handle(turn_id).cancel()
        except RPCError as err:
            if err.status in SERVER_AWAY:
                raise
    for turn_id in turn_ids:
        await announce_end(store, client, task_queue, await store.load_turn(turn_id))
