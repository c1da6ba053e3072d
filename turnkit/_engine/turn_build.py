"""Creating a turn from a user's text: the trigger message and the pending turn record (behaviour §1.4 ``build_turn``).

One function for both ways a root turn is created: submitted through its conversation's lane (``ask``; the lane's
``turnkit.submit_turn`` activity) and prepared without being submitted (``build_turn``; see
:mod:`turnkit._engine.prepared`), so the two cannot persist different options.
"""

from __future__ import annotations

from turnkit._engine.dispatch import model_policy
from turnkit._engine.turn_options import turn_options
from turnkit._engine.waits import add_waits
from turnkit.agent import Agent
from turnkit.kernel.payloads import QueuedTurn, SubmitTurn, TurnTicket
from turnkit.kernel.records import ConversationRecord, TurnRecord
from turnkit.store.store import StoreTx, utcnow

__all__ = ["create_turn", "queued_with_root", "root_of", "ticket_of"]


async def create_turn(
    tx: StoreTx,
    conversation: ConversationRecord,
    agent: Agent,
    request: SubmitTurn,
    *,
    submitted: bool,
    found_absent: bool = False,
    direct: bool = False,
    task_queue: str | None = None,
) -> TurnRecord:
    """Append ``request``'s text as a user message and create its turn: ``pending`` (or ``paused``), its frozen
    context ending at that message; ``submitted_at`` is now when ``submitted``, else None (a prepared turn).

    Raises:
        ToolError: A ``wait_for`` target is not allowed (the transaction rolls back the message and the turn).

    ``found_absent``: the caller looked for ``request.turn_id`` in this transaction and found none (one read fewer).
    ``direct``: ``ask`` starts it without the lane (:mod:`turnkit._engine.direct_turn`). ``task_queue``: where a
    submitted turn runs (its workers run it again if the submission is lost, :mod:`turnkit._engine.lost_submits`).
    """
    message = await tx.append_message(
        conversation.id,
        role="user",
        content=[{"type": "text", "text": request.text}, *request.media] if request.media else None,
        text=None if request.media else request.text,
        id=request.message_id,
        metadata=request.message_metadata,
    )
    principal = request.principal if request.principal is not None else conversation.metadata.get("principal")
    options = turn_options(
        agent,
        trigger_message_id=message.id,
        context=request.context if request.context is not None else conversation.metadata.get("turnkit_context", {}),
        principal=principal,
        thinking=request.thinking,
        thinking_set=request.thinking_set,
        output_schema=request.output_schema,
        prompt_mode=request.prompt_mode,
        callback_conversation_id=request.callback_conversation_id,
        paused=request.paused,
        compact=request.compact,
        budget=request.budget,
        task_queue=task_queue,
    )
    turn = await tx.create_turn(
        status="paused" if request.paused else "pending",
        id=request.turn_id,
        conversation_id=conversation.id,
        agent_name=agent.name,
        context_message_sequence=message.sequence,
        model=request.model or conversation.model or agent.effective_model,
        options=options,
        root_turn_id=request.root_turn_id,  # None: the turn is its own root
        submitted_at=utcnow() if submitted else None,
        found_absent=found_absent,
        direct=direct,
    )
    if request.wait_for:
        await add_waits(tx, turn, request.wait_for)
    return turn


async def root_of(tx: StoreTx, turn: TurnRecord) -> TurnRecord:
    """The root of ``turn``'s tree (itself, unless it joined another run's tree)."""
    return turn if turn.root_turn_id == turn.id else await tx.load_turn(turn.root_turn_id)


def ticket_of(
    turn: TurnRecord, *, busy: bool = False, root: TurnRecord | None = None, ahead: QueuedTurn | None = None
) -> TurnTicket:
    """The submission ticket of a stored turn (its deadline: root submission + the root's timeout)."""
    deadline = (root or turn).deadline
    return TurnTicket(
        turn_id=turn.id,
        conversation_id=turn.conversation_id,
        agent_name=turn.agent_name,
        root_turn_id=turn.root_turn_id,
        trigger_message_id=turn.options.trigger_message_id or "",
        deadline=deadline,
        busy=busy,
        model_policy=model_policy(),
        ahead=ahead,
    )


async def queued_with_root(tx: StoreTx, turn: TurnRecord) -> QueuedTurn:
    """What a lane queues of the stored ``turn``, with its tree's deadline (its root's, if it joined another tree)."""
    return ticket_of(turn, root=await root_of(tx, turn)).queued()
