"""``ConversationWorkflow``: the conversation's serial lane (workflow id = conversation id).

At most one turn of a conversation is active; submitted turns wait in FIFO order and run as children of the lane
(child workflow id = turn id). Submission is an update (used with update-with-start): its handler writes the trigger
message and the turn record through an activity and returns the turn id at once; the main loop runs the turns. The
lane continues-as-new only when idle, carrying its queue and a bounded window of recent submissions.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from turnkit.payloads import LaneInput, LaneStatus, QueuedTurn, SubmitTurn, TurnInput, TurnTicket

    from workflows.turn import TurnWorkflow

__all__ = ["ConversationWorkflow", "RECENT_WINDOW"]

#: How many recent submissions the lane remembers to recognise a retried submit across continue-as-new.
RECENT_WINDOW = 256
SUBMIT_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=10))


@workflow.defn(name="ConversationWorkflow")
class ConversationWorkflow:
    """The lane: FIFO, one active turn, idle continue-as-new."""

    @workflow.init
    def __init__(self, lane: LaneInput) -> None:
        # Handlers can run before run() (update-with-start, after continue-as-new): all state is set up here.
        self._conversation_id = lane.conversation_id
        self._queue: list[QueuedTurn] = list(lane.queue)
        self._recent: dict[str, TurnTicket | None] = dict.fromkeys(lane.recent_turn_ids)
        self._turns_started = lane.turns_started
        self._active: str | None = None
        # Submissions write to the store one at a time, so queue order = creation order = message order.
        self._submitting = asyncio.Lock()

    @workflow.update(name="submit")
    async def submit(self, request: SubmitTurn) -> TurnTicket:
        """Append the trigger message, create the pending turn and queue it; returns its ids at once."""
        async with self._submitting:
            ticket = await workflow.execute_activity(
                "turnkit.submit_turn",
                request,
                result_type=TurnTicket,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=SUBMIT_RETRY,
                summary="submit turn",
            )
            if ticket.turn_id not in self._recent:
                # A retried submit (same turn id) returns the same ticket and is not queued twice.
                self._queue.append(
                    QueuedTurn(
                        turn_id=ticket.turn_id,
                        agent_name=ticket.agent_name,
                        root_turn_id=ticket.root_turn_id,
                        deadline=ticket.deadline,
                    )
                )
                self._remember(ticket)
            return ticket

    @submit.validator
    def _validate_submit(self, request: SubmitTurn) -> None:
        if request.conversation_id != self._conversation_id:
            raise ApplicationError(
                f"turn submitted to conversation {request.conversation_id} reached lane {self._conversation_id}",
                type="InvalidSubmission",
            )

    @workflow.query(name="status")
    def status(self) -> LaneStatus:
        """What runs and what waits in this lane."""
        return LaneStatus(
            conversation_id=self._conversation_id,
            active_turn_id=self._active,
            queued_turn_ids=[queued.turn_id for queued in self._queue],
            turns_started=self._turns_started,
        )

    @workflow.run
    async def run(self, lane: LaneInput) -> None:
        while True:
            await workflow.wait_condition(lambda: bool(self._queue) or self._should_continue_as_new())
            if self._queue:
                await self._run_turn(self._queue.pop(0))
                continue
            # Idle and Temporal suggests a fresh run: let in-flight submissions land first, then roll over.
            await workflow.wait_condition(workflow.all_handlers_finished)
            if self._queue:
                continue
            workflow.continue_as_new(
                LaneInput(
                    conversation_id=self._conversation_id,
                    queue=self._queue,
                    recent_turn_ids=list(self._recent),
                    turns_started=self._turns_started,
                )
            )

    async def _run_turn(self, queued: QueuedTurn) -> None:
        self._active = queued.turn_id
        self._turns_started += 1
        try:
            await workflow.execute_child_workflow(
                TurnWorkflow.run,
                TurnInput(
                    turn_id=queued.turn_id,
                    conversation_id=self._conversation_id,
                    agent_name=queued.agent_name,
                    root_turn_id=queued.root_turn_id,
                    deadline=queued.deadline,
                ),
                id=queued.turn_id,
                static_summary=f"turn · {queued.agent_name}",
            )
        except ChildWorkflowError as err:
            # A turn that crashed (a bug, a termination) must not take the lane down with it.
            workflow.logger.warning("turn %s ended abnormally: %s", queued.turn_id, err.cause or err)
        finally:
            self._active = None

    def _remember(self, ticket: TurnTicket) -> None:
        self._recent[ticket.turn_id] = ticket
        while len(self._recent) > RECENT_WINDOW:
            del self._recent[next(iter(self._recent))]

    def _should_continue_as_new(self) -> bool:
        return workflow.info().is_continue_as_new_suggested()
