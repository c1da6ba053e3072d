"""A stored turn and its conversation's lane, from outside the lane: submit it again, or wait until the lane starts it.

* :func:`resubmit` repeats a root turn's submission (update-with-start ``submit``). The lane's
  submit finds the stored turn and writes nothing; the lane queues it unless it knows it already. ``Turn.result()``,
  ``turnkit repair`` and the workers' search for lost submissions (:mod:`turnkit._ops.lost_submits`) use it.
* :func:`until_started` asks the lane's ``turn_started`` update, which returns once the lane has started the turn's
  workflow: ``Turn.result()`` of a queued turn waits there instead of polling the store.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Final, Literal

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from turnkit.config import settings
from turnkit.kernel.names import LANE_ROLLING_OVER, LANE_WORKFLOW, SUBMIT_UPDATE, TURN_STARTED_UPDATE
from turnkit.kernel.payloads import LaneInput, SubmitTurn, TurnTicket
from turnkit.kernel.records import TurnRecord
from turnkit.kernel.search_attributes import lane_search_attributes

__all__ = ["LaneAnswer", "lane_start", "resubmit", "until_started"]

#: What :func:`until_started` learnt: the lane's answer (``started``, ``unknown``, ``again``), or ``away`` (the server
#: did not answer; try again after a pause).
LaneAnswer = Literal["started", "unknown", "again", "away"]
_ANSWERS: Final = ("started", "unknown", "again")


def lane_start(conversation_id: str, agent_name: str, task_queue: str) -> WithStartWorkflowOperation[None, None]:
    """The start half of an update-with-start on the conversation's lane (``USE_EXISTING``: a running lane is kept)."""
    return WithStartWorkflowOperation(
        LANE_WORKFLOW,
        LaneInput(conversation_id=conversation_id),
        id=conversation_id,
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        static_summary=f"conversation · {agent_name}",
        search_attributes=lane_search_attributes(conversation_id, agent_name) if settings.search_attributes else None,
    )


async def resubmit(client: Client, turn: TurnRecord, task_queue: str) -> TurnTicket:
    """Submit the stored root ``turn`` to its lane again; the lane is started on ``turn.options.task_queue`` (else
    ``task_queue``) if it is not running. The update id is new each time: an update-with-start whose id completed
    in the lane's closed run would get that run's answer instead of a new run (a terminated lane), and the lane
    itself recognises a turn it queued already.

    Raises:
        WorkflowUpdateFailedError: The lane rejected it.
        RPCError: The server did not take it.
    """
    request = SubmitTurn(
        conversation_id=turn.conversation_id,
        turn_id=turn.id,
        message_id=turn.options.trigger_message_id or "",
        agent_name=turn.agent_name,
    )
    start = lane_start(turn.conversation_id, turn.agent_name, turn.options.task_queue or task_queue)
    return await client.execute_update_with_start_workflow(
        SUBMIT_UPDATE,
        request,
        start_workflow_operation=start,
        id=f"{turn.id}-again-{uuid.uuid4().hex[:12]}",
        result_type=TurnTicket,
    )


async def until_started(client: Client, turn: TurnRecord) -> LaneAnswer:
    """Wait until the lane of the queued root ``turn`` has started its workflow (``started``); ``unknown`` when the
    lane does not hold it (or no lane runs); ``again`` when the lane continued as new meanwhile (ask again);
    ``away`` when the server did not answer. Bound it with ``asyncio.timeout``: the update stays with the lane and
    returns when the turn starts."""
    handle = client.get_workflow_handle(turn.conversation_id)
    update_id = f"{turn.id}-started-{uuid.uuid4().hex[:12]}"  # one per wait: a repeated request joins it
    while True:
        try:
            answer = await handle.execute_update(TURN_STARTED_UPDATE, turn.id, id=update_id, result_type=str)
        except WorkflowUpdateRPCTimeoutOrCancelledError as err:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError from err  # the caller's timeout, not the long poll's
            continue  # the long poll ran out: the update still waits in the lane
        except WorkflowUpdateFailedError as err:
            if isinstance(err.cause, ApplicationError) and err.cause.type == LANE_ROLLING_OVER:
                return "again"  # refused while the lane continues as new: its next run answers
            return "unknown"  # a lane of a release without the update, or one that ended
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return "unknown"  # no lane runs: nothing holds the turn
            return "away"
        return answer if answer in _ANSWERS else "unknown"  # type: ignore[return-value]
