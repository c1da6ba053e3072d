"""Starting a root turn's workflow (workflow id = turn id): one way, for the lane's ``turnkit.start_turn`` activity
and for ``ask``'s direct turns (:mod:`turnkit._engine.direct_turn`)."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from turnkit.kernel.names import TURN_WORKFLOW
from turnkit.kernel.payloads import TurnInput
from turnkit.kernel.search_attributes import turn_search_attributes

__all__ = ["start_turn_workflow"]


async def start_turn_workflow(
    client: Client, task_queue: str, turn: TurnInput, *, search_attributes: bool, eager: bool = True
) -> bool:
    """Start ``turn``'s workflow; True if this call started it.

    ``REJECT_DUPLICATE``: a workflow that exists, running or closed (an earlier attempt, a lane, the client that
    wrote the turn), is never started again, so a turn never runs twice. Eager: when this client's own worker has a
    free slot, the reply hands it the turn's first workflow task (none of the server's rate-limited queues in between).
    """
    attributes = None
    if search_attributes:
        attributes = turn_search_attributes(
            conversation_id=turn.conversation_id,
            agent_name=turn.agent_name,
            root_turn_id=turn.root_turn_id,
            parent_turn_id=None,
        )
    try:
        await client.start_workflow(
            TURN_WORKFLOW,
            turn,
            id=turn.turn_id,
            task_queue=task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            static_summary=f"turn · {turn.agent_name}",
            search_attributes=attributes,
            request_eager_start=eager,
        )
    except WorkflowAlreadyStartedError:
        return False
    return True
