"""Prepared turns (behaviour §1.4, §5.2; cases T04, T05): built now, previewed, submitted later.

``Conversation.build_turn`` writes the trigger message and a ``pending`` turn whose ``submitted_at`` is None: its
frozen context is fixed, but no lane has it and nothing runs it (``turnkit check`` does not count it as lost work).
``Turn.preview`` builds the request its next model call would send, with the model activity's own builder
(:func:`turnkit._engine.request.build_model_request`). ``Turn.perform_later`` (or ``Turn.run``, which also waits)
submits it: the lane's ``submit`` update with the turn's own id, whose activity finds the record, stamps
``submitted_at`` (:func:`submit_prepared`) and queues it, exactly as a repair re-queues a stored turn. The root deadline
(``timeout``) counts from that submission.
"""

from __future__ import annotations

from typing import Final

from turnkit._engine.request import build_model_request
from turnkit.agent import resolve_agent
from turnkit.kernel.records import TurnRecord
from turnkit.model import ModelRequest
from turnkit.store.store import Store, StoreTx, utcnow

__all__ = ["SUBMITTABLE", "preview_request", "submit_prepared"]

#: Statuses a turn may be submitted in (a prepared turn that waits for others is ``waiting``).
SUBMITTABLE: Final = ("pending", "paused", "waiting")


async def submit_prepared(tx: StoreTx, turn: TurnRecord) -> TurnRecord:
    """Stamp a prepared turn's ``submitted_at`` (a compare-and-set on its status); the record as it now is.

    A turn that left the submittable statuses meanwhile (cancelled) is returned unchanged: its workflow ends at once.
    """
    if turn.submitted_at is not None:
        return turn
    submitted = await tx.claim_turn(turn.id, from_=turn.status, to=turn.status, submitted_at=utcnow())
    return submitted if submitted is not None else await tx.load_turn(turn.id)


async def preview_request(store: Store, turn: TurnRecord) -> ModelRequest:
    """The request the next model call of ``turn`` would send; nothing is called or written (behaviour §1.5).

    Messages are read as the model activity reads them (the frozen context plus the turn's own); ``request_id`` is
    the reserved request's, None before the first.
    """
    agent = resolve_agent(turn.agent_name)
    async with store.atomic() as tx:
        messages = await tx.list_messages(
            turn.conversation_id, through_sequence=turn.context_message_sequence, turn_id=turn.id
        )
    return await build_model_request(store, turn, agent, messages, request_id=turn.options.state.request_id)
