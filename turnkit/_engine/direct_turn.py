"""A turn ``ask`` starts without the conversation's lane: a fresh conversation's first, or the next turn of an idle one.

The lane exists to put a conversation's turns in order. When a conversation has no turn, or every turn of it has
ended (nothing is running, waiting, paused or queued), there is nothing to order yet, so ``ask`` skips the lane: it
writes the message and the turn in one store transaction and starts the turn's workflow itself (workflow id = turn
id). That saves the lane's start (on a first turn), its ``submit`` update and its workflow task (with the submit and
start local activities in it), and the staged-input round trip: the measured figures are in ``bench/README.md``. The
design, with the race it closes, is in docs/design.md ("A fresh conversation's first turn").

How the lane still keeps one active turn per conversation: the turn row is marked ``direct``, and it is written only
when the conversation has no unfinished turn, under the conversation's row lock. Every lane transaction that queues
or wakes a turn (``turnkit.submit_turn``, ``turnkit.deliver``) takes the same lock and asks for an active direct turn
(:meth:`~turnkit.store.store.StoreTx.turns_outside_lane`); when there is one, the lane runs it first: its start is a
no-op (``REJECT_DUPLICATE``), or the start that a client that died after its commit never made, and the lane follows
it to its end as it follows its own turns. A lane that ran the conversation's earlier turns holds nothing of them once
they have ended, so it orders a direct turn as it orders a first one.
"""

from __future__ import annotations

from turnkit._engine.turn_build import create_turn, queued_with_root
from turnkit.agent import resolve_agent
from turnkit.config import settings
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.payloads import SubmitTurn, TurnInput
from turnkit.store.store import Store

__all__ = ["can_start_directly", "write_direct_turn"]


def can_start_directly(request: SubmitTurn) -> bool:
    """Whether ``request`` may skip the lane if its conversation has nothing to order: ``settings.direct_first_turns``,
    not paused (a paused turn waits in its lane for a resume) and without ``wait_for`` (its edges need the store's
    wait-graph lock, which the lane's submit takes)."""
    return settings.direct_first_turns and not request.paused and not request.wait_for


async def write_direct_turn(
    store: Store, request: SubmitTurn, agent_name: str, *, task_queue: str | None = None
) -> TurnInput | None:
    """Append ``request``'s message and create its turn, marked ``direct``, if the conversation has no turn yet (or,
    with ``settings.direct_idle_turns``, no unfinished one); return the turn workflow's input. None, with nothing
    written, when it has one (its lane orders this turn) or ``agent_name`` is not registered in this process (a
    worker elsewhere may know it). ``task_queue``: where it is started (the workers there start it if this process
    dies first, :mod:`turnkit._ops.lost_submits`).

    Idempotent by the turn id: a repeat after a lost commit reply finds the turn it wrote.
    """
    try:
        agent = resolve_agent(request.agent_name or agent_name)
    except ConfigError:
        return None
    async with store.atomic(conversation_id=request.conversation_id) as tx:
        turn, in_the_way = await tx.find_turn_or_any(
            request.turn_id, request.conversation_id, unfinished=settings.direct_idle_turns
        )
        if turn is None:
            if in_the_way:
                return None
            conversation = await tx.load_conversation(request.conversation_id)  # read with its lock on PostgreSQL
            turn = await create_turn(
                tx, conversation, agent, request, submitted=True, found_absent=True, direct=True, task_queue=task_queue
            )
        queued = await queued_with_root(tx, turn)
    return queued.turn_input(turn.conversation_id)
