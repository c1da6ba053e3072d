"""A submitted turn whose submission was lost, written as the store holds one after a ``kill -9`` of caller, worker
and server together inside the submit's window (``tests/test_lost_submits.py`` makes that kill for real; the chaos
job draws it as its ``lost_submit`` fault)."""

from __future__ import annotations

from turnkit._engine.turn_options import turn_options
from turnkit.agent import Agent
from turnkit.kernel.records import TurnRecord
from turnkit.store import Store
from turnkit.store.store import utcnow


async def write_lost_turn(store: Store, conversation_id: str, agent: Agent, text: str, task_queue: str) -> TurnRecord:
    """The trigger message and a pending turn of ``agent``, submitted on ``task_queue``, with no workflow and no place
    in a lane, in one transaction."""
    async with store.atomic(conversation_id=conversation_id) as tx:
        message = await tx.append_message(conversation_id, role="user", text=text)
        options = turn_options(agent, trigger_message_id=message.id, context={}, task_queue=task_queue)
        return await tx.create_turn(
            conversation_id=conversation_id,
            agent_name=agent.name,
            context_message_sequence=message.sequence,
            model="scripted",
            options=options,
            submitted_at=utcnow(),
        )
