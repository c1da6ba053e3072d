"""The ``turnkit.deliver`` activity: apply deliveries to a conversation, and wake it when idle (behaviour §5.11)."""

from __future__ import annotations

from temporalio import activity

from turnkit._engine.lane_order import earlier_turns
from turnkit._engine.turn_build import queued_with_root, ticket_of
from turnkit._engine.turn_options import turn_options
from turnkit.agent import resolve_agent
from turnkit.kernel.activities import DeliveryCalls, implements
from turnkit.kernel.errors import ConfigError, RecordNotFound
from turnkit.kernel.payloads import DeliverBatch, DeliverResult, QueuedTurn
from turnkit.kernel.records import MessageRecord, TurnRecord
from turnkit.store.store import Store, StoreTx, utcnow

__all__ = ["DeliveryActivities"]


class DeliveryActivities(DeliveryCalls):
    """Delivery activities bound to a store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    @implements(DeliveryCalls.deliver)
    async def deliver(self, batch: DeliverBatch) -> DeliverResult:
        """Append each pending delivery exactly once (message + ``delivered_at`` in one transaction), then wake.

        A delivery for another conversation, an unknown id or an already-delivered one is skipped: signals are
        hints, the rows are the truth.
        """
        delivered: list[str] = []
        async with self.store.atomic(conversation_id=batch.conversation_id) as tx:
            if batch.wake:
                outside = await tx.turns_outside_lane(batch.conversation_id)
                if outside.sub_agent:
                    return DeliverResult(busy=True)  # its end wakes the lane; the input goes in after its messages
                if outside.direct is not None:  # ask's direct turn runs: the lane follows it, then delivers
                    return DeliverResult(ahead=await queued_with_root(tx, outside.direct))
            for delivery_id in batch.delivery_ids:
                try:
                    delivery = await tx.load_delivery(delivery_id)
                except RecordNotFound:
                    activity.logger.warning("signal for unknown delivery %s ignored", delivery_id)
                    continue
                if delivery.destination_conversation_id != batch.conversation_id:
                    continue
                if delivery.delivered_at:
                    if not batch.wake and await _unconsumed(tx, batch.conversation_id, delivery.message_id):
                        # Applied, by an earlier attempt whose completion was lost (or by a duplicate signal), and no
                        # turn has it yet: report it, so the lane wakes a turn for it when idle (issue 8).
                        delivered.append(delivery.id)
                    continue
                message = await tx.append_message(
                    batch.conversation_id,
                    role="user",
                    text=str(delivery.payload.get("text", "")),
                    metadata={
                        "delivery_id": delivery.id,
                        "principal": delivery.payload.get("principal"),
                        "source_conversation_id": delivery.source_conversation_id,
                        "source_turn_id": delivery.source_turn_id,
                    },
                )
                if await tx.mark_delivered(delivery.id, message_id=message.id) is None:
                    raise RuntimeError(f"delivery {delivery.id} was applied concurrently")  # rolls back the append
                delivered.append(delivery.id)
            if not batch.wake:
                return DeliverResult(delivered_ids=delivered)
            woken = await self._wake(tx, batch)
            # Submissions the lane lost run before the woken turn (turnkit._engine.lane_order).
            earlier = await earlier_turns(tx, batch.conversation_id, batch.known_turn_id, before=woken)
        return DeliverResult(delivered_ids=delivered, turn=_queued(woken) if woken else None, earlier=earlier)

    async def _wake(self, tx: StoreTx, batch: DeliverBatch) -> TurnRecord | None:
        """Start a turn for delivered input no turn has consumed yet; None when there is none (behaviour §5.11).

        The woken turn's id is the lane's choice, so a retry whose first attempt committed the turn but lost its
        completion finds that turn and returns it: the lane runs it, none is orphaned.
        """
        conversation_id = batch.conversation_id
        woken_id = batch.woken_turn_id
        if woken_id is not None:
            existing = await tx.find_turn(woken_id)
            if existing is not None:
                return existing
        trigger = await _next_delivery_trigger(tx, conversation_id)
        if trigger is None:
            return None
        conversation = await tx.load_conversation(conversation_id)
        try:
            agent = resolve_agent(conversation.agent_name)
        except ConfigError:
            activity.logger.error(
                "cannot wake %s: agent %r is not registered", conversation_id, conversation.agent_name
            )
            return None
        # The woken turn acts for the destination conversation, never for the sender (behaviour §7.2).
        options = turn_options(
            agent,
            trigger_message_id=trigger.id,
            context=conversation.metadata.get("turnkit_context", {}),
            principal=conversation.metadata.get("principal"),
            task_queue=activity.info().task_queue if activity.in_activity() else None,  # where the lane's worker runs
        )
        turn = await tx.create_turn(
            id=woken_id,
            conversation_id=conversation_id,
            agent_name=agent.name,
            context_message_sequence=await tx.latest_message_sequence(conversation_id),
            model=conversation.model or agent.effective_model,
            options=options,
            submitted_at=utcnow(),
        )
        return turn


def _queued(turn: TurnRecord) -> QueuedTurn:
    return ticket_of(turn).queued()


async def _unconsumed(tx: StoreTx, conversation_id: str, message_id: str | None) -> bool:
    """Whether the delivered message ``message_id`` is beyond every submitted turn's snapshot (no turn has it)."""
    if message_id is None:
        return False
    message = await tx.load_message(message_id)
    turns = await tx.list_turns(conversation_id=conversation_id)
    consumed = max((t.context_message_sequence for t in turns if t.submitted_at is not None), default=0)
    return message.sequence > consumed


async def _next_delivery_trigger(tx: StoreTx, conversation_id: str) -> MessageRecord | None:
    """The newest delivered message beyond each submitted turn's snapshot (behaviour §2.9)."""
    turns = await tx.list_turns(conversation_id=conversation_id)
    consumed = max((t.context_message_sequence for t in turns if t.submitted_at is not None), default=0)
    messages = await tx.list_messages(conversation_id, after_sequence=consumed)
    delivered = [m for m in messages if m.metadata.get("delivery_id")]
    return delivered[-1] if delivered else None
